"""The smallest Django settings the example needs: one app, sqlite, no admin, no templates."""

from __future__ import annotations

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "examples.django_app.urls"
INSTALLED_APPS = ["examples.django_app"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("EXAMPLE_DB", os.path.join(os.path.dirname(__file__), "db.sqlite3")),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
USE_TZ = True
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
SCHEDULER_QUEUE = os.environ.get("SCHEDULER_QUEUE", "default")
