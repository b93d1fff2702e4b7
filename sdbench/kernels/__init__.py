"""Implementations, one module per backend family; importing a module registers its entries."""
