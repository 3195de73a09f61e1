"""Replaying job traces through the scheduling pass with a virtual clock."""
