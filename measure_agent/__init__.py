"""tunefleet measurement agent: renders kernels from installed templates, builds, times and checks them.

Light by design (numpy, numba, grpcio, protobuf only) so it runs on a Raspberry Pi.
"""

__version__ = "0.1.0"
