"""Celery tests that start an in-process worker of their own.

They live outside ``tests/celery_ext``: its package-scoped worker stays up until that
package's last test, and two in-process workers in one process share Celery's global
worker state and kombu's event loop (one could stall or stop the other).
"""
