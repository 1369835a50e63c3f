"""Configuration: the user's ``.logoptin`` and the administrator's config file.

Two files, two policies (docs/user.md, docs/admin.md):

``.logoptin`` (the user's, read when the job starts)
    Its existence is the opt-in. Its content is YAML: empty means ``mode: enabled``.
    ``load_optin`` never raises for a bad file: whatever is wrong (invalid YAML, an unknown key,
    a bad value, a symlink, a FIFO, a device, a file over 64 KiB, a file owned by someone else,
    a world-writable or unreadable file) the job still runs, logging falls back to the most
    private mode, ``disabled``, and ``OptinResult.problems`` says why, each problem naming the
    file, line, column and key. Values are never quoted back unless they are plainly a typo of
    a valid word: people paste secrets into the wrong place.

Admin config (``/etc/logcapture/config.yaml``, or ``$LOGCAPTURE_CONFIG``)
    ``load_admin`` fails early and precisely: a ``ConfigError`` listing every problem. A missing
    file means the defaults. Each key can be overridden by ``LOGCAPTURE_<KEY>`` in the
    environment (``LOGCAPTURE_FLUSH_INTERVAL=0.5``); environment beats file beats default.

The package is split by concern, each module using only those before it:

- ``checking``: a YAML file read against a schema, each value checked, problems located.
- ``optin``: ``.logoptin`` (``load_optin``, ``OptinConfig``, ``OptinResult``).
- ``defaults``: the admin settings' defaults by key (``ADMIN_DEFAULTS``).
- ``admin``: the admin config (``load_admin``, ``AdminConfig``).

Nothing is imported here: each caller imports the module it needs.
"""
