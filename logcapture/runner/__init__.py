"""The runner: run a command under pseudo-terminals and pump its bytes; know nothing of content.

Entry point: ``run(argv, sink, options) -> Outcome``.

- stdout and stderr each get their own pty, so both are ttys (``isatty()`` true, colours and
  progress bars as in a shell) and stay separate streams. stdin is passed through untouched
  (the command inherits the caller's stdin, so pipes and interactive terminals both work).
- With ``Options.merge`` (the caller's stdout and stderr go to the same place:
  ``same_destination``) both are one pty, as in a terminal or under ``script``: the order in
  which the command wrote to the two reaches that place as it wrote it, which two ptys read
  by one reader cannot keep (a write to stderr right after one to stdout may be read first).
  That one stream is ``stdout``: it is copied to the caller's stdout and fed as ``stdout``.
- Output post-processing is switched off on both ptys (no ``\\n`` -> ``\\r\\n``), so what is
  copied to the real stdout/stderr is byte-identical to what the command wrote.
- The window size is the caller's terminal's, else ``LOGCAPTURE_COLUMNS`` x ``LOGCAPTURE_LINES``,
  else 80 x 24 (a pty left at 0 x 0 makes tqdm print nothing). SIGWINCH on the
  wrapper re-reads the caller's size, applies it to both ptys and is forwarded to the command.
- The command runs in its own session and process group, without a controlling terminal, as
  a batch job has none: a background process it leaves behind is not sent SIGHUP when it
  exits, and reading an interactive stdin never stops it with SIGTTIN. TERM,
  INT, HUP, QUIT, USR1, USR2, CONT, TSTP, ALRM and WINCH received by the wrapper are forwarded
  to the command's process group: Slurm's proctrack/cgroup signals only the step's first
  process, the wrapper. A repeated TERM is forwarded again; the wrapper itself
  exits only after the command, with its status.
- Every chunk read is first copied to the real output, then handed to ``sink.feed``. A sink
  that raises is disabled with one ``logcapture:`` warning; the command and its output go on.
- The sink may be a ``Worker``: a capture process forked by ``fork_worker`` before the command
  is spawned and before any thread starts, so that rendering runs on another core and never
  holds the GIL of this reader. Chunks then go to it as frames (``frame.py``: stream, wall
  time, monotonic time, data) over a pipe written without blocking; what the pipe cannot take at
  once waits in a buffer of at most ``Options.worker_buffer`` bytes. When that buffer is
  full the reader stops reading the ptys until the worker catches up: the job is then slowed
  by the terminal's own flow control, and nothing is lost. The reader never sleeps and never
  waits on the worker while the command runs, except in that case. A worker that exits or
  accepts nothing for ``worker_timeout`` seconds is given up with one ``logcapture:`` warning;
  the command and its output go on. At the end the reader sends the ``Outcome`` (an ``end``
  frame) and waits up to ``worker_timeout`` seconds for the worker to finish the spool.
- After the command exits the ptys are drained until every writer has closed them (EIO), or
  they have been quiet for ``drain_idle`` seconds, or ``drain_timeout`` seconds have passed: a
  background grandchild that holds the pty open cannot hang the wrapper.

The package is split by concern, each module using only those before it:

- ``outcome``: ``Options`` (how to run a command) and ``Outcome`` (how it ended; resource use).
- ``terminal``: the ptys and their window size (``open_terminals``, ``caller_winsize``).
- ``descriptors``: the caller's standard descriptors (``reserve_std_fds``, ``same_destination``).
- ``signals``: the signals forwarded to the command (``FORWARDED_SIGNALS``, ``Forwarder``).
- ``worker``: the capture process as the reader sees it (``fork_worker``, ``Worker``).
- ``readloop``: ``ReadLoop``, one round per wake-up (linger, read the ptys, copy, send to the
  worker) until the drain is over.
- ``spawn``: ``run`` opens the ptys, installs the signal handlers, spawns the command, reads it
  and hands the worker the outcome; ``attach`` for a command another process started.
- ``exits``: ``exec_command``, ``exit_like``, ``leave``: how the wrapper hands over or ends.

Nothing is imported here: each caller imports the module it needs, and ``logcapture run`` loads
only what it uses.
"""
