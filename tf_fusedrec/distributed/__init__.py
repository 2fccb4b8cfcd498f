"""Communication backends and the stages of the distributed fused lookup."""
