"""pcieprof: PCIe/virtualization performance profiler and topology tuner for multi-GPU LLM serving."""

__version__ = "0.1.0"
