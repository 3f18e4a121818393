"""The orders app: charging a card."""
