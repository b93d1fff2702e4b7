"""sdbench: kernels, references and measurements for the verification step of speculative decoding."""

__version__ = "0.1.0"
