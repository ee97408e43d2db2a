"""The tuner: infer the real fabric, search the ring, write NCCL files, rules, layout advice.

Everything here reads bundles (through pandas tables and topology.json) and never measures.
"""
