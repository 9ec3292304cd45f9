"""onnxruntime's log lines go to the action log, deduplicated, with one console line."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

from eval_paths import ROOT
from qbuild_onnx.ort_logs import ort_output_to_log, summarize


def test_python_records_are_deduplicated_and_counted():
    log: list[str] = []
    warn: list[str] = []
    with ort_output_to_log(log.append, warn.append):
        for _ in range(5):
            logging.getLogger().warning("Please consider to run pre-processing")
        logging.getLogger().warning("another")
    assert log == ["onnxruntime (warning): Please consider to run pre-processing  (x5)",
                   "onnxruntime (warning): another"]
    # the engine writes the target's label for the token (a cached action has none)
    assert warn == ["onnxruntime printed 6 log line(s) (2 distinct); read them with: "
                    "qbuild log <this target>"]


def test_timestamps_do_not_defeat_deduplication():
    lines = ["2026-11-23 19:01:02.1 [W:onnxruntime:, graph.cc:1] Removing initializer w",
             "2026-11-23 19:01:03.9 [W:onnxruntime:, graph.cc:1] Removing initializer w"]
    out: list[str] = []
    assert summarize(lines, out.append) == (2, 1)
    assert out == ["[W:onnxruntime:, graph.cc:1] Removing initializer w  (x2)"]


def test_native_stderr_of_a_worker_process_is_captured(tmp_path):
    """In a worker process (as heavy rules run), lines written to fd 2 by C++ code land in
    the log, not on the console."""
    code = textwrap.dedent(f"""
        import multiprocessing, os, sys
        sys.path.insert(0, {str(ROOT / "plugins")!r})

        def work(q):
            from qbuild_onnx.ort_logs import ort_output_to_log
            log, warn = [], []
            with ort_output_to_log(log.append, warn.append):
                for _ in range(3):
                    os.write(2, b"[W:onnxruntime:, x.cc:1] native warning\\n")
            q.put((log, warn))

        if __name__ == "__main__":
            q = multiprocessing.get_context("spawn").Queue()
            p = multiprocessing.get_context("spawn").Process(target=work, args=(q,))
            p.start(); print(q.get(timeout=60)); p.join()
    """)
    script = tmp_path / "worker.py"  # spawn re-imports the main module: it needs a file
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=90)
    assert r.returncode == 0, r.stderr
    assert "native warning" not in r.stderr
    assert "native warning  (x3)" in r.stdout and "printed 3 log line(s)" in r.stdout
