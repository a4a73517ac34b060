"""The models users bring, qualified on 2 ranks: each with the verdict it must get and, where
it fails, the tensors and cause it must name (``test_zoo.py``; the factories beside it)."""
