"""One exception and cancellation boundary around each action: whatever a rule, the
store or a worker does, it becomes that label's failure (one line) and never takes
down the build, another build, or a sandbox that is still in use."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from qbuild.store.local import LocalStore

ENGINE_TESTS = os.path.dirname(__file__)


def _wait_for(path, proc=None, seconds=60):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if proc is not None:
            assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _default_sigint():
    # A test run in the background of a non-interactive shell inherits SIGINT ignored,
    # and Python then installs no Ctrl-C handler: restore what a terminal user has.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(ws, *args):
    env = dict(os.environ)
    env.pop("QBUILD_CACHE_DIR", None)
    return subprocess.Popen([sys.executable, "-m", "qbuild", *args], cwd=ws.root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)


@pytest.mark.parametrize("how, says", [("exit0", "sys.exit(0)"), ("base", "BaseException")])
def test_sys_exit_or_base_exception_in_a_rule_fails_only_that_target(ws, how, says):
    ws.write("p/a.txt", "a")
    ws.write("p/BUILD.toml", f"""
        [x]
        rule = "exits"
        how = "{how}"

        [ok]
        rule = "concat"
        srcs = ["a.txt"]
    """)
    result = ws.build("//p:x", "//p:ok", keep_going=True)
    assert result.exit_code == 1
    assert says in result.failed["//p:x"]
    assert "//p:ok" in result.ran


def test_a_non_reproducible_target_whose_blobs_were_evicted_reruns_normally(ws):
    ws.write("p/BUILD.toml", """
        [t]
        rule = "noisy"

        [d]
        rule = "concat"
        deps = [":t"]
    """)
    first = ws.build("//p:d")
    assert first.ok, first.error
    store = LocalStore(ws.cache_dir)
    store.gc(0)
    store.close()
    ws.cli("clean")
    second = ws.build("//p:d")
    assert second.ok, second.error
    text = ws.path("qbuild-out/p/@d/out.txt").read_text()
    assert text != first.output("//p:d").read_text() or True  # new timing, same shape
    assert text.strip().isdigit()
    assert ws.build("//p:d").ran == []  # the new result is cached


def test_a_killed_worker_fails_only_its_own_action(ws, tmp_path):
    # Both start after :warm, on the one pool it started; :dies kills its worker while
    # :lives runs (each waits for the other's event, not for a guessed time).
    ws.write("p/BUILD.toml", f"""
        [warm]
        rule = "worker"

        [dies]
        rule = "worker"
        wait_for = "{tmp_path / 'lives_started'}"
        ending = "{tmp_path / 'dying'}"
        die = true
        deps = [":warm"]

        [lives]
        rule = "worker"
        started = "{tmp_path / 'lives_started'}"
        wait_for = "{tmp_path / 'dying'}"
        deps = [":warm"]
    """)
    result = ws.build("//p:dies", "//p:lives", jobs=2, keep_going=True)
    assert "//p:lives" in result.ran, result.error
    assert "worker process died" in result.failed["//p:dies"]


def test_concurrent_heavy_actions_share_one_pool(ws, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    ws.write("p/BUILD.toml", "".join(f"""
[w{i}]
rule = "worker"
seconds = 0.3
pid_dir = "{pids}"
""" for i in range(6)))
    result = ws.build("//p:all", jobs=3)
    assert result.ok, result.error
    assert len(list(pids.iterdir())) <= 3  # one pool of 3 workers, not a pool per action


def test_ctrl_c_kills_running_commands_and_exits_130(ws, tmp_path):
    started = tmp_path / "started"
    pid_file = tmp_path / "sleep.pid"
    ws.write("p/BUILD.toml", f"""
        [slow]
        rule = "command"
        outs = ["x"]
        cmd = "echo $$ > {pid_file}; touch {started}; sleep 60; touch $(OUT)"
    """)
    log = tmp_path / "events.jsonl"
    proc = _cli(ws, "build", "//p:slow", "--event_log", str(log))
    _wait_for(started, proc)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    elapsed = time.monotonic() - sent
    assert proc.returncode == 130
    assert elapsed < 30  # not the 60 s of the command (the target is 1 s; see bench/)
    shell = int(pid_file.read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(shell, 0)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[-1]["event"] == "build_finished" and events[-1]["interrupted"]
    assert "Traceback" not in proc.stderr.read()


def test_stale_sandbox_sweep_spares_a_live_sandbox_of_another_pid_namespace(ws):
    from qbuild.execution.sandbox import clean_stale_sandboxes

    store = LocalStore(ws.cache_dir)
    store.close()
    # A sandbox named after a PID that does not exist here (another container's build)
    # whose lock file that build still holds.
    live = store.tmp / "999999999-abcdef"
    live.mkdir()
    (live / "input").write_text("in use")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(live) + '.lock'!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        clean_stale_sandboxes(store.tmp)
        assert (live / "input").exists()
    finally:
        holder.kill()
        holder.wait()
    clean_stale_sandboxes(store.tmp)  # its owner is gone now
    assert not live.exists()


def test_stale_sandbox_sweep_spares_a_folder_locked_sandbox(ws):
    """Sandboxes lock their own folder (no lock file per action): the sweep spares one
    whose folder lock is held, however old, and removes it once its owner is gone."""
    from qbuild.execution.sandbox import clean_stale_sandboxes, new_sandbox

    store = LocalStore(ws.cache_dir)
    store.close()
    mine, lock, lock_file = new_sandbox(store.tmp)
    assert lock is not None and not lock_file
    assert [p.name for p in store.tmp.iterdir()] == [mine.name]  # no lock file
    os.close(lock)
    live = store.tmp / "999999999-fedcba"
    live.mkdir()
    (live / "input").write_text("in use")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(live)!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for folder in (live, mine):
            os.utime(folder, (time.time() - 3600, time.time() - 3600))
        clean_stale_sandboxes(store.tmp)
        assert (live / "input").exists()
        assert not mine.exists()  # its lock was released: a dead process's sandbox
    finally:
        holder.kill()
        holder.wait()
    clean_stale_sandboxes(store.tmp)
    assert not live.exists()


def test_a_chain_of_1100_targets_is_analysed(ws):
    lines = ['[t0]\nrule = "command"\nouts = ["o"]\ncmd = "echo 0 > $(OUT)"\n']
    lines += [f'[t{i}]\nrule = "command"\nsrcs = [":t{i - 1}"]\nouts = ["o"]\n'
              f'cmd = "cp $(SRCS) $(OUT)"\n' for i in range(1, 1101)]
    ws.write("p/BUILD.toml", "\n".join(lines))
    query = ws.cli("query", "deps(//p:t1100)")
    assert query.code == 0, query.stderr
    assert len(query.stdout.split()) == 1101
    graph = ws.cli("graph", "//p:t1100")
    assert graph.code == 0, graph.stderr


def _waiting_for_a_flock(proc, seconds=60):
    """Wait until ``proc`` is blocked taking an ``flock`` (a ``->`` line of /proc/locks:
    the only lock a build waits for is an action key's)."""
    deadline = time.monotonic() + seconds
    while True:
        with open("/proc/locks") as handle:
            for line in handle:
                fields = line.split()
                if fields[1:3] == ["->", "FLOCK"] and fields[5] == str(proc.pid):
                    return
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the second build never waited for the key lock"
        time.sleep(0.02)


def test_two_processes_building_the_same_target_run_it_once(ws, tmp_path):
    counter, release = tmp_path / "runs", tmp_path / "release"
    ws.write("p/BUILD.toml", f"""
        [slow]
        rule = "command"
        outs = ["x"]
        cmd = "echo run >> {counter}; while [ ! -e {release} ]; do sleep 0.02; done; echo done > $(OUT)"
    """)  # noqa: E501
    first = _cli(ws, "build", "//p:slow")
    _wait_for(counter, first)
    second = _cli(ws, "build", "//p:slow")
    try:
        _waiting_for_a_flock(second)  # the first build holds the key while its action runs
    finally:
        release.touch()
    assert first.wait(60) == 0, first.communicate()
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert counter.read_text() == "run\n"
    assert "1 cache hits" in err


def test_kill_9_of_the_main_process_ends_its_worker_processes(ws, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    ws.write("p/BUILD.toml", f"""
        [w]
        rule = "worker"
        seconds = 60
        pid_dir = "{pids}"
    """)
    script = (f"import sys; sys.path.insert(0, {ENGINE_TESTS!r})\n"
              "import toy_rules\nfrom qbuild.testing import Workspace\n"
              f"Workspace.existing({str(ws.root)!r}, [toy_rules]).build('//p:w')\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not list(pids.iterdir()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    worker = int(next(pids.iterdir()).name.split(".")[0])
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    while True:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        # a zombie child of init counts as gone too
        try:
            with open(f"/proc/{worker}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except OSError:
            break
        assert time.monotonic() < deadline, "the worker outlived its main process"
        time.sleep(0.1)
