"""Versions of the software stack for the manifest: driver, CUDA, NVML, torch, NCCL."""

from __future__ import annotations

from typing import Any

from pcieprof.discover.nvml import Missing, Nvml, _cuda_version, _text


def versions(nvml: Any = None) -> dict[str, Any]:
    """Driver, CUDA driver and NVML versions (through NVML), torch, its CUDA and NCCL.

    Args:
        nvml: an `Nvml` wrapper or pynvml-like library to ask; default: the installed pynvml.

    Returns:
        {"driver", "cuda" (CUDA version of the driver, as nvidia-smi prints it), "nvml", "torch",
        "torch_cuda", "nccl", "status": {field: why}} (keys as in the manifest's `versions`);
        a value that cannot be had is None with its status (never an exception).
    """
    out: dict[str, Any] = {"status": {}}
    w = nvml if isinstance(nvml, Nvml) else Nvml(nvml)
    w.init()
    cuda = w.call("nvmlSystemGetCudaDriverVersion_v2")
    if isinstance(cuda, Missing):
        cuda = w.call("nvmlSystemGetCudaDriverVersion")
    for key, value, conv in (("driver", w.call("nvmlSystemGetDriverVersion"), _text),
                             ("cuda", cuda, _cuda_version),
                             ("nvml", w.call("nvmlSystemGetNVMLVersion"), _text)):
        if isinstance(value, Missing):
            out[key] = None
            out["status"][key] = value.status
        else:
            out[key] = conv(value)
    if w is not nvml:
        w.shutdown()
    try:
        import torch  # heavy: torch (seconds to import)

        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        if torch.version.cuda is None:
            out["status"]["torch_cuda"] = "not_supported: CPU build of torch"
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        else:
            out["nccl"] = None
            out["status"]["nccl"] = "not_supported: torch sees no CUDA device"
    except Exception as e:  # noqa: BLE001 - a broken torch install is a status, not a crash
        for k in ("torch", "torch_cuda", "nccl"):
            out.setdefault(k, None)
            out["status"].setdefault(k, f"error: {type(e).__name__}: {e}")
    return out
