"""fullgraph.kernels"""
