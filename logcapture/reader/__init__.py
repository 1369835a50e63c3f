"""The read service: users on a login node, which sees neither the compute nodes' spools nor
the store's credentials, read their own runs through a service the administrator runs.

- ``server``: ``ReadService`` answers ``query.Reader`` questions on a Unix socket, as the
  user the kernel says connected (``SO_PEERCRED``), filtered by owner.
- ``client``: ``ServiceReader``, the same Reader over the socket, and ``service_socket``,
  where the CLI finds it.
- ``protocol``: the one request line and the NDJSON answer both sides speak.
- ``sessions``: how the service reaches the store (a pool of server clients, or turns with
  the agent on an embedded store).
"""
