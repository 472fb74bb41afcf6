"""The DDTree runtime's Triton kernels, each beside its PyTorch reference (named apart from the
PyPI package `kernels`, which transformers >= 5.25 imports)."""
