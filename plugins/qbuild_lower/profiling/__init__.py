"""Where the time goes: interleaved latency and onnxruntime's per-op profiles
(``timing``), multiply-accumulate counts (``macs``) and the ``profile`` rule's
report.md (``report``)."""
