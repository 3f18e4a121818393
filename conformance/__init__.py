"""The OJS retry conformance suite: the spec's scenarios run through each adapter and broker.

``ojs-retry conformance`` or ``pytest --pyargs conformance`` grades them into a matrix.
"""
