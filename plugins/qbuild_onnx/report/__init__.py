"""Human-readable reports (static HTML) of evaluations and auto-quantization."""
