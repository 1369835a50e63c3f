"""A short message when it matters, to users who asked for one in their ``.logoptin``.

The job's Start record carries what its user asked for when it started (``config.notify``:
``events`` among ``failed``, ``stalled``, ``nan-metric``; ``mail``, an address, default the
user's own mailbox). ``Notifier.send(event, run, user, insights, notify)`` then

- mails the user through the site's mail command, as Slurm's MailProg is called
  (``MAILPROG -s SUBJECT ADDRESS``, the body on standard input; admin key ``mail_prog``), and
- posts the same message as JSON to the administrator's webhook, when there is one
  (``notify_webhook``: ``{"text": ..., "run": ..., "event": ..., "insights": [...]}``, the
  ``text`` key as chat services' incoming webhooks take it),

at most once per job and event: a marker file created with ``O_EXCL`` in ``state_dir`` (root's
``<spool root>/.notified`` for the agent and the epilog) is taken before sending. A message
holds only insights, whose text is the stored lines': text a mode dropped is never in it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

EVENTS = ("failed", "stalled", "nan-metric")
MAX_EVIDENCE = 3
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def wanted(start: Mapping[str, Any] | None, event: str) -> dict[str, Any] | None:
    """The user's notify settings from a Start record (object or dict) when ``event`` is one
    they asked for, else None."""
    if start is None:
        return None
    config = start.get("config") if isinstance(start, Mapping) else getattr(start, "config",
                                                                            None)
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return None
    notify = config.get("notify") if isinstance(config, Mapping) else None
    if not isinstance(notify, Mapping) or event not in (notify.get("events") or ()):
        return None
    return dict(notify)


def compose(event: str, run: str, job_id: str, insights: Sequence[Mapping[str, Any]]
            ) -> tuple[str, str]:
    """(subject, body) of the message for ``event``."""
    what = {"failed": "failed", "stalled": "stalled", "nan-metric": "a metric became NaN"}
    name = f"job {job_id}" if job_id else f"run {run}"
    first = insights[0]["message"] if insights else ""
    subject = f"logcapture: {name} {what.get(event, event)}"
    if first:
        subject += f": {first}"
    subject = subject[:200]
    body = [f"logcapture: {name} ({run}) {what.get(event, event)}.", ""]
    for i in insights:
        body.append(f"{i['kind']}: {i['message']}")
        for e in [e for e in i.get("evidence") or () if e.get("text") is not None][
                -MAX_EVIDENCE:]:
            body.append(f"    {e['stream']} line {e['seq']}: {e['text']}")
        if i.get("hint"):
            body.append(f"    try: {i['hint']}")
    body += ["", f"logcapture show {job_id or run}  says more.",
             "You get this message because your ~/.logoptin asks for it (notify:)."]
    return subject, "\n".join(body) + "\n"


class Notifier:
    """Sends each (run, event) message once. ``mail_prog``: the mail command (None: no mail);
    ``webhook``: the administrator's URL (None: none); ``state_dir``: where the markers go."""

    def __init__(self, state_dir: Path, mail_prog: str | None = None,
                 webhook: str | None = None, timeout: float = 10.0):
        self.state_dir = Path(state_dir)
        self.mail_prog = mail_prog
        self.webhook = webhook
        self.timeout = timeout

    def _claim(self, run: str, uid: int, event: str) -> bool:
        """Take the marker of (run, uid, event); False when it was already taken."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = f"{_SAFE.sub('_', run)}.{uid}.{event}"
        try:
            fd = os.open(self.state_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                         | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def send(self, event: str, run: str, user: str, uid: int, job_id: str,
             insights: Sequence[Mapping[str, Any]], notify: Mapping[str, Any]) -> list[str]:
        """Send the message of ``event`` (once per run and event); returns problems, [] when
        all went (or it had gone before)."""
        if event not in EVENTS or not self._claim(run, uid, event):
            return []
        subject, body = compose(event, run, job_id, insights)
        problems = []
        address = str(notify.get("mail") or user)
        if self.mail_prog:
            problems += self._mail(subject, body, address)
        if self.webhook:
            problems += self._post({"text": f"{subject}\n{body}", "event": event, "run": run,
                                    "job_id": job_id, "user": user, "insights": list(insights)})
        return problems

    def _mail(self, subject: str, body: str, address: str) -> list[str]:
        if address.startswith("-"):
            return ["mail not sent: the address is not valid"]
        try:
            done = subprocess.run([str(self.mail_prog), "-s", subject, address],
                                  input=body.encode("utf-8"), capture_output=True,
                                  timeout=self.timeout, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            return [f"mail not sent: {self.mail_prog}: {type(e).__name__}"]
        if done.returncode != 0:
            return [f"mail not sent: {self.mail_prog} exited {done.returncode}"]
        return []

    def _post(self, payload: dict[str, Any]) -> list[str]:
        import urllib.request  # ~20 ms of imports (http, email, ssl) every reading command spared

        data = json.dumps(payload, ensure_ascii=False, default=str).encode("utf-8")
        req = urllib.request.Request(str(self.webhook), data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                resp.read()
        except (OSError, ValueError) as e:
            # the URL is the administrator's and may hold a token: never quoted
            return [f"webhook not reached: {type(e).__name__}"]
        return []
