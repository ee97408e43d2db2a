"""Analysis of results bundles: all-reduce curves, the decode band, P2P matrices and inferred
levels, decode-time attribution, the analytic comm model, compare metrics, provenance wording.

Imported by tune and report; imports only the bundle and the foundation (tests/test_layers.py).
"""
