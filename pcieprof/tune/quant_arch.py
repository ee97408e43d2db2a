"""Whether a card's quantized checkpoint loads on the box's GPU architecture.

SGLang refuses to load a model whose quantization method needs a newer GPU: the model loader
compares the GPU's compute capability with the method's `get_min_capability()` and raises
"The quantization method ... is not supported for the current GPU". A launch line that would
stop there is not offered.
"""

from __future__ import annotations

from pcieprof.analysis.box import Box
from pcieprof.bundle.recommendations import Risk

#: --quantization value -> the minimum compute capability (major x 10 + minor) SGLang accepts.
#: Only methods whose bound was read in the source are listed; others are not checked.
MIN_CAPABILITY: dict[str, int] = {
    # SGLang 0.5.23 (the pinned release) python/sglang/srt/layers/quantization/modelopt_quant.py:
    # ModelOptFp4Config.get_min_capability() returns 80 (older sources said 100)
    "modelopt_fp4": 80,
}
#: --quantization value -> (the compute capability its native GEMMs need, what runs below it).
#: SGLang 0.5.23 modelopt_quant.py: "ModelOpt NVFP4 native dense GEMM backends require SM100+.
#: Use --fp4-gemm-backend marlin on SM80-SM90"; fp4_utils.initialize_fp4_gemm_config: the
#: `auto` backend picks marlin for capability 8.0 to below 10.0.
NATIVE_CAPABILITY: dict[str, tuple[int, str]] = {
    "modelopt_fp4": (100, "marlin"),
}
_SOURCE = ("sgl-project/sglang v0.5.23 python/sglang/srt/layers/quantization/modelopt_quant.py "
           "(get_min_capability), fp4_utils.py (initialize_fp4_gemm_config)")


def capability(arch: str) -> int | None:
    """`sm120` -> 120; None when the architecture is unknown or not spelled `smNN`."""
    digits = arch[2:] if arch.startswith("sm") else ""
    return int(digits) if digits.isdigit() else None


def blocked(quantization: str, box: Box | None) -> str:
    """Why a `--quantization` checkpoint cannot load on `box`'s GPUs, or "" when it can (or the
    architecture or the method's bound is unknown: nothing is claimed then)."""
    need = MIN_CAPABILITY.get(quantization)
    have = capability(box.arch) if box is not None else None
    if need is None or have is None or have >= need:
        return ""
    return (f"--quantization {quantization} needs compute capability {need // 10}.{need % 10} "
            f"or newer (SGLang 0.5.23's get_min_capability; the loader refuses older GPUs), this box "
            f"is {box.arch if box else '?'} ({box.arch_source if box else ''})")


def unchecked(quantization: str, box: Box | None) -> Risk | None:
    """The risk a launch line carries when the method has a bound but the box's architecture
    is unknown (shown with the line, with its check), or None."""
    need = MIN_CAPABILITY.get(quantization)
    if need is None or (box is not None and capability(box.arch) is not None):
        return None
    return Risk(id="quantization_min_capability",
                title=(f"--quantization {quantization} needs compute capability "
                       f"{need // 10}.{need % 10} or newer; this bundle does not tell the GPUs' "
                       "architecture"),
                check=("nvidia-smi --query-gpu=compute_cap --format=csv (SGLang refuses to load "
                       "the checkpoint below it)"),
                sources=[_SOURCE])


def fallback(quantization: str, box: Box | None) -> Risk | None:
    """The risk of a launch line on GPUs that load the checkpoint but lack its native GEMMs
    (NVFP4 on sm80-sm90 runs through Marlin kernels), or None."""
    native = NATIVE_CAPABILITY.get(quantization)
    have = capability(box.arch) if box is not None else None
    if native is None or have is None or have >= native[0] or blocked(quantization, box):
        return None
    need, kernel = native
    return Risk(id="quantization_fallback_kernels",
                title=(f"--quantization {quantization} on {box.arch if box else '?'}: SGLang's "
                       f"native kernels for it need compute capability {need // 10}.{need % 10}; "
                       f"below that it runs through {kernel} (--fp4-gemm-backend auto picks it), "
                       "so the card's published speeds (measured on newer GPUs) do not apply"),
                check=(f"the server log's fp4 GEMM backend is {kernel}; launch with "
                       f"--fp4-gemm-backend {kernel} or auto, not a flashinfer_* backend"),
                sources=[_SOURCE])
