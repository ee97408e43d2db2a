"""The tuner: decides from a bundle what to change (NCCL settings, ring order, NCCL files,
parallel layout) and says why, with the gain per decode all-reduce and per decode step.

It reads bundles through pcieprof.analysis and writes the Recommendations document; it never
measures (recommend --verify re-measures through pcieprof.measurement, wired by the command)
and never launches (layout commands come from the CommandBuilder its caller passes).
"""
