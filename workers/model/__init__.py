"""Calling models: the chat completions wire format, the HTTP client, the routes and
their fleet-wide limits, and what a reply costs.
"""
