"""``stowage.fit``: the same device trains a larger model, or longer sequences (README's "Fitting
a larger model": what it records, weighs and chooses, and the table it prints)."""

from stowage.fitting.fit import check_allocator, fit
from stowage.fitting.fitted import Fitted

__all__ = ["Fitted", "check_allocator", "fit"]
