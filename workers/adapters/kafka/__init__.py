"""Kafka: producing and admin through kafka-python."""
