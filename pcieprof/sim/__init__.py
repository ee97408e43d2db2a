"""The PCIe fabric model: declarative fabric descriptions (fabric.py, profiles/*.toml), P2P and
concurrent-traffic predictions (model.py), the NCCL all-reduce model (collectives.py), the sim
backend that writes a bundle from them (backend.py) and the calibration against published
measurements (calibration/)."""
