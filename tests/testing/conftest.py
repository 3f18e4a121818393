"""``tests/testing``: the instant-retries API as a user's test suite would use it.

``django_example/`` is a Django project with its own pytest settings; it runs in a
subprocess (``test_django_example.py``), never as part of this suite, so
pytest-django stays inert here.
"""

collect_ignore = ["django_example"]
