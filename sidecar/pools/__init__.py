"""The pools: the relay's HTTP/1.1 client to them, choosing a replica, and polling each
replica's engine state and served settings.
"""
