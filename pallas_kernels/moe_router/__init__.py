"""A mixture of experts' router: the softmax of each token's expert logits, its top-k experts and
their (optionally renormalized) probabilities, in one kernel."""
