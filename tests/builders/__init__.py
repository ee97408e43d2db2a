"""What the tests build and run, in one place (imported as `builders`: pytest puts tests/ on the
path through tests/conftest.py).

- `bundles`: bundles, rows and topology documents from published numbers; simulated bundles.
- `sysfs`: fake Linux filesystem roots (sysfs, /proc) for discovery.
- `cuda`: a CPU stand-in for the CUDA stream/event API, for the probes' timing logic.
- `cli`: the one way to run the `pcieprof` command line (in-process or as a real process).
- `browser`: reports in headless Chromium.
- `launch_search`: the launch search on the reference server, interrupted and resumed (made once
  per session by conftest's `launch_search`).
"""
