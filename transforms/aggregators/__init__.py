"""The two Prio3 aggregators of the aggregate model (see README.md)."""
