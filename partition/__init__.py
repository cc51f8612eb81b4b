"""fullgraph.partition"""
