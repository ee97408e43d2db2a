"""Analysis of results bundles: decode-time attribution from traces, and the analytic comm model."""
