from __future__ import annotations

from django.urls import path

from examples.django_app import views

urlpatterns = [
    path("orders", views.create_order),
    path("orders/<int:order_id>", views.show_order),
]
