"""Exact full-graph propagation: fixed linear operators applied over the whole graph on P ranks.

The modules of this package compute what a model reads but does not train: the propagation
operators of a part (:mod:`fullgraph.propagation.operators`: GCN's ``D^-1/2 (A + I) D^-1/2``,
the neighbour mean, the symmetric-normalised adjacency without self-loops), their hops
``[X, A X, ..., A^K X]`` (:mod:`fullgraph.propagation.hops`, one halo exchange per hop, every
row summed in ascending global id: P ranks give one process's bits), and the hops kept with the
partition (:mod:`fullgraph.propagation.cache`) for later runs. SGC and SIGN
(:mod:`fullgraph.models.layers.sign`) train on the hops; Correct & Smooth propagates labels and
errors with the same operators.

Nothing heavy is imported here: import the modules themselves.
"""
