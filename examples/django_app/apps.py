from __future__ import annotations

from django.apps import AppConfig


class DjangoAppConfig(AppConfig):
    name = "examples.django_app"
    label = "orders"
