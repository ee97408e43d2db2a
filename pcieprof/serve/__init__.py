"""serve-bench: model cards, launching SGLang (or the reference server), load, decode curve, traces."""
