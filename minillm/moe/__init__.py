"""Mixture of experts: a router and expert FFNs in place of a block's FFN (a plug-in of the model)."""
