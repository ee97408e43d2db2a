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
    # sgl-project/sglang python/sglang/srt/layers/quantization/modelopt_quant.py
    # @faeb968: ModelOptFp4Config.get_min_capability() returns 100 (NVFP4 needs Blackwell)
    "modelopt_fp4": 100,
}


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
            f"or newer (SGLang's get_min_capability; the loader refuses older GPUs), this box "
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
                sources=["sgl-project/sglang python/sglang/srt/layers/quantization/"
                         "modelopt_quant.py @faeb968 (get_min_capability)"])
