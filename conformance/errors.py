"""Exception classes the conformance scripts raise, with OJS error types of their own."""

from __future__ import annotations


class PaymentError(Exception):
    """Base of the payment errors: matches ``payment.error`` and, by prefix, ``payment.*``."""

    ojs_error_type = "payment.error"


class CardStolen(PaymentError):
    """A non-retryable payment failure (ojs-retry.md section 12.3)."""

    ojs_error_type = "payment.card_stolen"
