"""The Celery binding: the app and its tasks, the queues on Redis or RabbitMQ, sending
messages in one round trip, and task events that reach Flower from any pool.
"""
