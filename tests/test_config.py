"""config/: the user's .logoptin (config.optin: never raises, falls back to mode disabled)
and the admin config (config.admin: raises ConfigError naming file, line, column and key)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logcapture.config.admin import AdminConfig, load_admin
from logcapture.config.optin import (
    OPTIN_MAX_BYTES,
    OptinConfig,
    OptinResult,
    load_optin,
    optin_path,
)
from logcapture.errors import ConfigError

IS_ROOT = os.geteuid() == 0
OTHER_UID = 65534  # nobody


def write(tmp_path: Path, content: str | bytes, name: str = ".logoptin") -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def assert_refused(result: OptinResult, *fragments: str) -> str:
    """A refused file: still opted in, mode disabled, one problem naming the file."""
    assert result.opted_in
    assert result.config == OptinConfig(mode="disabled")
    assert result.problems, "a refused file must say why"
    message = "\n".join(result.problems)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# ------------------------------------------------------------------------------ optin_path


def test_optin_path_default_is_home_logoptin():
    assert optin_path({"HOME": "/home/alice"}) == Path("/home/alice/.logoptin")


def test_optin_path_from_environment():
    env = {"HOME": "/home/alice", "LOGCAPTURE_OPTIN": "/etc/x/optin.yaml"}
    assert optin_path(env) == Path("/etc/x/optin.yaml")


def test_optin_path_empty_variable_means_default():
    assert optin_path({"HOME": "/h", "LOGCAPTURE_OPTIN": ""}) == Path("/h/.logoptin")


def test_optin_path_without_home_uses_passwd():
    import pwd

    expected = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".logoptin"
    assert optin_path({}) == expected


# ------------------------------------------------------------------------------ valid files


def test_missing_file_is_not_opted_in(tmp_path):
    result = load_optin(tmp_path / ".logoptin")
    assert not result.opted_in
    assert result.problems == []


def test_missing_parent_is_not_opted_in(tmp_path):
    (tmp_path / "file").write_text("")
    assert not load_optin(tmp_path / "file" / ".logoptin").opted_in
    assert not load_optin(tmp_path / "nodir" / ".logoptin").opted_in


@pytest.mark.parametrize("content", ["", "\n", "# just a comment\n", "---\n", "{}\n", "~\n",
                                     "\ufeff", "  \n\n"])
def test_empty_means_enabled(tmp_path, content):
    result = load_optin(write(tmp_path, content))
    assert result == OptinResult(opted_in=True, config=OptinConfig(mode="enabled"), problems=[])
    assert result.ok


def test_no_files_and_an_empty_optin_never_load_pyyaml(tmp_path):
    # Every job's wrapper reads both files; PyYAML (~12 ms of CPU) is loaded only when one of
    # them holds something to parse, or a LOGCAPTURE_<KEY> override needs a YAML scalar.
    empty = write(tmp_path, "")
    code = ("import sys\nfrom logcapture.config.admin import load_admin\n"
            "from logcapture.config.optin import load_optin\n"
            f"r = load_optin({str(empty)!r})\n"
            f"a = load_admin({str(tmp_path / 'none.yaml')!r}, env={{}})\n"
            "print(r.opted_in, r.config.mode, a.flush_interval, 'yaml.reader' in sys.modules)\n"
            f"load_optin({str(write(tmp_path, 'mode: metadata', name='full'))!r})\n"
            "print('yaml.reader' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "enabled", "0.5", "False", "True"]


@pytest.mark.parametrize("mode", ["enabled", "metadata", "disabled"])
@pytest.mark.parametrize("template", ["mode: {}\n", "mode: '{}'", 'mode: "{}"  # comment\n',
                                      "{{mode: {}}}", "---\nmode: {}\n...\n"])
def test_each_mode(tmp_path, mode, template):
    result = load_optin(write(tmp_path, template.format(mode)))
    assert result.problems == []
    assert result.config.mode == mode


# ------------------------------------------------------------------------------ bad content


def test_invalid_yaml_names_file_line_and_column(tmp_path):
    path = write(tmp_path, "# my config\nmode: [enabled\n")
    message = assert_refused(load_optin(path), str(path), "invalid YAML")
    assert f"{path}:3:1:" in message  # the flow list is still open at the end of the file


def test_invalid_yaml_mapping_values(tmp_path):
    path = write(tmp_path, "mode: enabled: metadata\n")
    assert_refused(load_optin(path), f"{path}:1:14:", "invalid YAML",
                   "mapping values are not allowed")


def test_tab_indentation(tmp_path):
    path = write(tmp_path, "mode:\n\tenabled\n")
    assert_refused(load_optin(path), f"{path}:2:1:", "invalid YAML")


def test_unknown_key_typo_is_named(tmp_path):
    path = write(tmp_path, "mode: enabled\nmdoe: metadata\n")
    assert_refused(load_optin(path), f"{path}:2:1:", "unknown key 'mdoe'", "did you mean 'mode'")


def test_unknown_key_not_a_typo_is_not_quoted(tmp_path):
    path = write(tmp_path, "ghp_s3cretT0ken: 1\n")
    message = assert_refused(load_optin(path), f"{path}:1:1:", "unknown key", "mode")
    assert "ghp_s3cretT0ken" not in message


def test_duplicate_key(tmp_path):
    path = write(tmp_path, "mode: enabled\nmode: disabled\n")
    assert_refused(load_optin(path), f"{path}:2:1:", "'mode'", "twice", "line 1")


@pytest.mark.parametrize("value, fragment", [
    ("enable", "did you mean enabled"),
    ("Metadata", "did you mean metadata"),
    ("off", "boolean false"),
    ("no", "boolean false"),
    ("yes", "boolean true"),
    ("true", "boolean true"),
    ("1", "not an integer"),
    ("1.5", "not a number"),
    ("", "not nothing (null)"),
    ("null", "not nothing (null)"),
    ("[enabled]", "not a list"),
    ("{a: b}", "not a mapping"),
    ("!!binary aGVsbG8=", "not a tagged value"),
    ("!custom enabled", "not a tagged value"),
])
def test_bad_mode_value(tmp_path, value, fragment):
    path = write(tmp_path, f"mode: {value}\n")
    assert_refused(load_optin(path), f"{path}:1:", "key 'mode'", "enabled, metadata, disabled",
                   fragment)


def test_bad_value_that_is_not_a_typo_is_not_quoted(tmp_path):
    path = write(tmp_path, "mode: hunter2-pa55word\n")
    message = assert_refused(load_optin(path), f"{path}:1:7:", "key 'mode'")
    assert "hunter2" not in message


def test_python_tags_are_never_constructed(tmp_path):
    marker = tmp_path / "pwned"
    path = write(tmp_path, f"mode: !!python/object/apply:os.system ['touch {marker}']\n")
    assert_refused(load_optin(path), f"{path}:1:7:")
    assert not marker.exists()


def test_undefined_alias_name_is_not_quoted(tmp_path):
    path = write(tmp_path, "mode: *s3cretAlias\n")
    message = assert_refused(load_optin(path), f"{path}:1:7:", "invalid YAML", "alias")
    assert "s3cretAlias" not in message


@pytest.mark.parametrize("content", ["- mode: enabled\n", "enabled\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path, content):
    path = write(tmp_path, content)
    assert_refused(load_optin(path), f"{path}:1:1:", "must be a mapping")


def test_several_documents(tmp_path):
    path = write(tmp_path, "mode: enabled\n---\nmode: metadata\n")
    assert_refused(load_optin(path), f"{path}:2:1:", "single document")


def test_not_utf8(tmp_path):
    path = write(tmp_path, b"mode: enabled\n# caf\xe9\n")
    assert_refused(load_optin(path), f"{path}:2:6:", "UTF-8")


def test_nul_byte(tmp_path):
    path = write(tmp_path, b"mode: en\x00abled\n")
    assert_refused(load_optin(path), f"{path}:1:9:", "#x0000")


def test_every_problem_is_reported(tmp_path):
    path = write(tmp_path, "mode: on\nmdoe: x\nother-thing: 2\n")
    result = load_optin(path)
    assert_refused(result)
    assert len(result.problems) == 3
    assert [p.split(":")[1] for p in result.problems] == ["1", "2", "3"]


# ------------------------------------------------------------------------------ bad files


def test_symlink_is_refused(tmp_path):
    target = write(tmp_path, "mode: enabled\n", name="real")
    link = tmp_path / ".logoptin"
    link.symlink_to(target)
    assert_refused(load_optin(link), str(link), "symbolic link")


def test_dangling_symlink_is_refused(tmp_path):
    link = tmp_path / ".logoptin"
    link.symlink_to(tmp_path / "nowhere")
    assert_refused(load_optin(link), str(link), "symbolic link")


def test_symlink_to_dev_null_is_refused(tmp_path):
    link = tmp_path / ".logoptin"
    link.symlink_to("/dev/null")
    assert_refused(load_optin(link), "symbolic link")


def test_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / ".logoptin"
    os.mkfifo(fifo)
    # Run in a child with a timeout: a blocking open would hang forever.
    code = ("import sys; from logcapture.config.optin import load_optin; "
            "r = load_optin(sys.argv[1]); print(r.config.mode); print(r.problems[0])")
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    mode, problem = done.stdout.splitlines()
    assert mode == "disabled"
    assert "FIFO" in problem and str(fifo) in problem
    # and in this process too, now that it is known not to hang
    assert_refused(load_optin(fifo), "FIFO")


def test_character_device_is_refused():
    assert_refused(load_optin("/dev/null", uid=os.stat("/dev/null").st_uid), "/dev/null",
                   "character device")


def test_directory_is_refused(tmp_path):
    directory = tmp_path / ".logoptin"
    directory.mkdir()
    assert_refused(load_optin(directory), str(directory), "directory")


def test_socket_is_refused(tmp_path):
    import socket

    path = tmp_path / "s"  # short: AF_UNIX paths are limited to about 108 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.bind(str(path))
        except OSError:
            pytest.skip("cannot bind a unix socket here")
        assert_refused(load_optin(path), "socket")


def test_too_big_is_refused(tmp_path):
    path = write(tmp_path, "mode: enabled\n" + "#" * OPTIN_MAX_BYTES)
    assert_refused(load_optin(path), str(path), "larger than 65536 bytes")


def test_exactly_the_limit_is_accepted(tmp_path):
    body = "mode: metadata\n"
    path = write(tmp_path, body + "#" * (OPTIN_MAX_BYTES - len(body)))
    assert path.stat().st_size == OPTIN_MAX_BYTES
    assert load_optin(path).config.mode == "metadata"


def test_world_writable_is_refused(tmp_path):
    path = write(tmp_path, "mode: enabled\n")
    path.chmod(0o666)
    assert_refused(load_optin(path), "writable by everyone")


def test_not_owned_by_the_job_user_is_refused(tmp_path):
    path = write(tmp_path, "mode: enabled\n")
    me = os.getuid()
    other = me + 1 if me != OTHER_UID else me - 1
    # Checking on behalf of another uid (what the root prolog does) needs no privilege.
    assert_refused(load_optin(path, uid=other), str(path), f"owned by uid {me}", f"uid {other}")


@pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root")
def test_file_chowned_to_someone_else_is_refused(tmp_path):
    path = write(tmp_path, "mode: enabled\n")
    os.chown(path, OTHER_UID, OTHER_UID)
    assert_refused(load_optin(path), str(path), f"owned by uid {OTHER_UID}")
    assert load_optin(path, uid=OTHER_UID).config.mode == "enabled"


@pytest.mark.skipif(IS_ROOT, reason="root reads a mode 000 file")
def test_unreadable_file_is_refused(tmp_path):
    path = write(tmp_path, "mode: enabled\n")
    path.chmod(0)
    try:
        assert_refused(load_optin(path), str(path), "cannot be read")
    finally:
        path.chmod(0o600)


@pytest.mark.skipif(not IS_ROOT, reason="needs root to become another user")
def test_unreadable_file_is_refused_as_another_user():
    """As root, fork a child that becomes 'nobody' and checks a mode 000 file that nobody
    owns: a genuine EACCES (the interpreter itself may not be reachable by nobody, so the
    child is a fork of this process, not a new one)."""
    base = Path(tempfile.mkdtemp(prefix="logcapture-unreadable-"))
    try:
        base.chmod(0o755)
        path = base / ".logoptin"
        path.write_text("mode: enabled\n")
        os.chown(path, OTHER_UID, OTHER_UID)
        path.chmod(0)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            status = 1
            try:
                os.close(read_end)
                os.setgroups([])
                os.setgid(OTHER_UID)
                os.setuid(OTHER_UID)
                result = load_optin(path)
                report = f"{result.opted_in} {result.config.mode}\n{result.problems[0]}\n"
                os.write(write_end, report.encode())
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as f:
            output = f.read().decode()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, output
        first, problem = output.splitlines()
        assert first == "True disabled"
        assert "cannot be read" in problem and str(path) in problem
    finally:
        for p in base.iterdir():
            p.unlink()
        base.rmdir()


def test_replaced_between_checks_is_caught(tmp_path, monkeypatch):
    """lstat sees one file, open gets another (a swap race): refused, not followed."""
    path = write(tmp_path, "mode: enabled\n")
    other = write(tmp_path, "mode: metadata\n", name="other")
    real_open = os.open

    def swapping_open(p, flags, *args):
        if Path(p) == path:
            os.replace(other, path)
        return real_open(p, flags, *args)

    monkeypatch.setattr(os, "open", swapping_open)
    assert_refused(load_optin(path), "replaced")


# ------------------------------------------------------------------------------ properties


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_content_never_raises_and_is_safe(tmp_path, data):
    path = write(tmp_path, data)
    result = load_optin(path)
    assert result.opted_in
    assert result.config.mode in ("enabled", "metadata", "disabled")
    if result.problems:
        assert result.config.mode == "disabled"
        assert all(p.startswith(str(path)) for p in result.problems)


SECRET = "sk_live_9fQ2xVbT7Lp"


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(template=st.sampled_from([
    "mode: {s}\n", "{s}: enabled\n", "mode: enabled\n{s}: 1\n", "{s}\n", "- {s}\n",
    "mode: [{s}\n", "mode: !{s} x\n", "mode: *{s}\n", "mode: &{s} [\n", "mode: '{s}\n",
    "mode: {{{s}: 1}}\n", "? {s}\n", "mode: |\n  {s}\n", "mode: \"{s}\\q\"\n",
    "%TAG !{s}! tag:x:\n--- !{s}!y\nmode: x\n", "mode: !<{s}> x\n",
]))
def test_problems_never_quote_secrets(tmp_path, template):
    path = write(tmp_path, template.format(s=SECRET))
    result = load_optin(path)
    assert result.config.mode == "disabled"
    for problem in result.problems:
        assert SECRET not in problem, problem
        assert "9fQ2" not in problem


# ------------------------------------------------------------------------------ admin config


def test_admin_missing_file_is_defaults(tmp_path):
    config = load_admin(tmp_path / "none.yaml", env={})
    assert config == AdminConfig()
    assert config.flush_interval == 0.5
    assert config.flush_records == 1000
    assert config.segment_bytes == 8 * 1024 * 1024


def test_admin_full_file(tmp_path):
    path = write(tmp_path, """\
store: https://logger:pw@clickhouse.example.org:8443/logs
spool_root: /var/spool/logcapture
sample_interval: 2.5
store_ttl_days: 30
cluster: alpha
flush_interval: 0.5
flush_records: 200
segment_bytes: 1048576
""", name="config.yaml")
    assert load_admin(path, env={}) == AdminConfig(
        store="https://logger:pw@clickhouse.example.org:8443/logs",
        spool_root="/var/spool/logcapture", sample_interval=2.5, store_ttl_days=30,
        cluster="alpha", flush_interval=0.5, flush_records=200, segment_bytes=1048576)


def test_admin_path_from_environment(tmp_path):
    path = write(tmp_path, "cluster: beta\n", name="c.yaml")
    assert load_admin(env={"LOGCAPTURE_CONFIG": str(path)}).cluster == "beta"


def test_admin_empty_file_is_defaults(tmp_path):
    assert load_admin(write(tmp_path, "", name="c.yaml"), env={}) == AdminConfig()


def test_admin_environment_overrides_file(tmp_path):
    path = write(tmp_path, "flush_interval: 3\ncluster: file\n", name="c.yaml")
    config = load_admin(path, env={"LOGCAPTURE_FLUSH_INTERVAL": "0.25",
                                   "LOGCAPTURE_FLUSH_RECORDS": "7",
                                   "LOGCAPTURE_STORE": "chdb:///var/lib/logcapture/db"})
    assert config.flush_interval == 0.25
    assert config.flush_records == 7
    assert config.store == "chdb:///var/lib/logcapture/db"
    assert config.cluster == "file"


def test_the_old_name_of_store_ttl_days_is_read_with_a_warning_naming_the_new(tmp_path):
    # ``retention_days`` was the store's TTL; the spool's retention is the shipper's own.
    path = write(tmp_path, "retention_days: 30\n", name="c.yaml")
    warnings: list[str] = []
    assert load_admin(path, env={}, warn=warnings.append).store_ttl_days == 30
    assert warnings == [f"{path}: 'retention_days' is deprecated, use 'store_ttl_days' (the "
                        "same setting; LOGCAPTURE_STORE_TTL_DAYS in the environment)"]
    assert load_admin(path, env={}).store_ttl_days == 30  # no warn: nothing said (a job)
    assert load_admin(tmp_path / "none", env={"LOGCAPTURE_RETENTION_DAYS": "8"},
                      warn=warnings.append).store_ttl_days == 8
    both = write(tmp_path, "retention_days: 30\nstore_ttl_days: 40\n", name="both.yaml")
    assert load_admin(both, env={}).store_ttl_days == 40  # the new name wins
    assert "retention_days" not in AdminConfig._fields
    assert load_admin(tmp_path / "none", env={}).store_ttl_days is None


def test_each_default_has_one_owner():
    from logcapture.config import defaults
    from logcapture.spool.writer import SpoolWriter

    config = AdminConfig()
    assert (config.flush_interval, config.flush_records, config.segment_bytes) == (
        defaults.FLUSH_INTERVAL, defaults.FLUSH_RECORDS, defaults.SEGMENT_BYTES)
    kw = SpoolWriter.__init__.__kwdefaults__
    assert (kw["flush_interval"], kw["flush_records"], kw["segment_bytes"]) == (
        config.flush_interval, config.flush_records, config.segment_bytes)


def test_admin_integer_seconds_become_float(tmp_path):
    config = load_admin(write(tmp_path, "sample_interval: 5\n", name="c.yaml"), env={})
    assert config.sample_interval == 5.0
    assert isinstance(config.sample_interval, float)


@pytest.mark.parametrize("content, line, column, key, fragment", [
    ("sample_interval: 0\n", 1, 18, "sample_interval", "greater than 0"),
    ("sample_interval: -1\n", 1, 18, "sample_interval", "greater than 0"),
    ("sample_interval: .inf\n", 1, 18, "sample_interval", "finite"),
    ("sample_interval: fast\n", 1, 18, "sample_interval", "not a string"),
    ("cluster: a\nstore_ttl_days: 1.5\n", 2, 17, "store_ttl_days", "whole number"),
    ("store_ttl_days: 0\n", 1, 17, "store_ttl_days", "greater than 0"),
    ("retention_days: 0\n", 1, 17, "retention_days", "greater than 0"),  # the old name
    ("flush_records: true\n", 1, 16, "flush_records", "not a boolean"),
    ("segment_bytes: 8MiB\n", 1, 16, "segment_bytes", "whole number"),
    ("cluster: 12\n", 1, 10, "cluster", "must be a string"),
    ("cluster: ''\n", 1, 10, "cluster", "empty"),
    ("store: mysql://x\n", 1, 8, "store", "DSN"),
    ("store: 5\n", 1, 8, "store", "DSN"),
    ("cluster: a\nflush_intervall: 1\n", 2, 1, "flush_intervall", "did you mean"),
    ("cluster: a\nbogus_option: 1\n", 2, 1, "bogus_option", "unknown key 'bogus_option'"),
])
def test_admin_bad_values_name_line_column_key(tmp_path, content, line, column, key, fragment):
    path = write(tmp_path, content, name="c.yaml")
    with pytest.raises(ConfigError) as info:
        load_admin(path, env={})
    error = info.value
    assert (error.path, error.line, error.column, error.key) == (str(path), line, column, key)
    assert fragment in error.message
    assert error.message.startswith(f"{path}:{line}:{column}:")
    assert error.exit_code == 2


def test_admin_invalid_yaml(tmp_path):
    path = write(tmp_path, "cluster: a\nstore: [\n", name="c.yaml")
    with pytest.raises(ConfigError) as info:
        load_admin(path, env={})
    assert info.value.line == 3 and info.value.column == 1
    assert "invalid YAML" in info.value.message


def test_admin_lists_every_problem(tmp_path):
    path = write(tmp_path, "sample_interval: 0\nretention_days: x\nfoo: 1\n", name="c.yaml")
    with pytest.raises(ConfigError) as info:
        load_admin(path, env={"LOGCAPTURE_FLUSH_RECORDS": "-3"})
    problems = info.value.problems
    assert len(problems) == 4
    assert problems[-1].startswith("environment variable LOGCAPTURE_FLUSH_RECORDS:")
    assert "4 problems" in info.value.message


def test_admin_never_quotes_the_dsn(tmp_path):
    path = write(tmp_path, "store: ftp://user:Sup3rS3cret@host\n", name="c.yaml")
    with pytest.raises(ConfigError) as info:
        load_admin(path, env={})
    assert "Sup3rS3cret" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_admin(tmp_path / "none", env={"LOGCAPTURE_STORE": "user:Sup3rS3cret@host"})
    assert "Sup3rS3cret" not in str(info.value)
    assert info.value.key == "store"


def test_admin_directory_and_fifo(tmp_path):
    with pytest.raises(ConfigError, match="directory"):
        load_admin(tmp_path, env={})
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        load_admin(fifo, env={})


@pytest.mark.skipif(IS_ROOT, reason="root reads a mode 000 file")
def test_admin_unreadable(tmp_path):
    path = write(tmp_path, "cluster: a\n", name="c.yaml")
    path.chmod(0)
    try:
        with pytest.raises(ConfigError, match="cannot be read"):
            load_admin(path, env={})
    finally:
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)


@pytest.mark.parametrize("value", ["enabled123", "disab1ed", "metadata!"])
def test_near_miss_with_digits_or_symbols_is_not_quoted(tmp_path, value):
    path = write(tmp_path, f"mode: {value}\n")
    message = assert_refused(load_optin(path), "not repeated here")
    assert value not in message


# Every key of the admin config set to a value other than its default, as an administrator
# writes it (the secrets included: the public config must leave them out).
EVERY_KEY = """\
store: https://logger:pw@clickhouse.example.org:8443/logs
notify_webhook: https://hooks.example.org/T0/SECRET
spool_root: /var/spool/lc
sample_interval: 2.5
store_ttl_days: 30
cluster: alpha
flush_interval: 0.25
flush_records: 200
segment_bytes: 1048576
spool_keep_free: 5%
job_output_limit: 1000000
job_output_tail: 50
job_metadata_limit: 9000
user_daily_bytes: 1000000000
insight_gpu_idle_percent: 15
insight_gpu_memory_used_fraction: 0.5
insight_cpu_efficiency_low: 0.3
insight_memory_overrequest_factor: 3
insight_time_limit_overrequest_factor: 5
insight_min_seconds: 60
stall_seconds: 900
mail_prog: /usr/sbin/sendmail-wrapper
reader_socket: /run/lc/reader.sock
admin_group: hpcadmins
reader_max_clients: 100
reader_max_clients_per_user: 4
reader_max_follows_per_user: 2
reader_request_timeout: 2.5
redact_variables: [SITE_*, "*_PASSPHRASE"]
redact_patterns: [hunter2, '/tok_[a-z0-9]{8}/']
"""


def test_the_public_config_reads_back_as_the_admin_config_without_its_secrets(tmp_path):
    from logcapture.config.admin import SECRET_KEYS, public_config

    admin = load_admin(write(tmp_path, EVERY_KEY, name="config.yaml"), env={})
    # the fixture sets every key, each away from its default
    assert all(v != AdminConfig._field_defaults[k] for k, v in admin._asdict().items())
    data = public_config(admin)
    assert b"SECRET" not in data and b"logger:pw" not in data
    assert public_config(admin) == data  # the same config, the same bytes (the prolog compares)
    public = write(tmp_path, data, name=".config.json")
    assert load_admin(public, env={}) == admin._replace(**dict.fromkeys(SECRET_KEYS))
    # An environment override still applies over it, checked as always.
    assert load_admin(public, env={"LOGCAPTURE_FLUSH_INTERVAL": "2"}).flush_interval == 2.0
    with pytest.raises(ConfigError, match="LOGCAPTURE_FLUSH_RECORDS: must be a whole number"):
        load_admin(public, env={"LOGCAPTURE_FLUSH_RECORDS": "many"})


def test_reading_the_public_config_does_not_load_pyyaml(tmp_path):
    # Every captured job's wrapper and every task's capture read it as they start.
    from logcapture.config.admin import public_config

    public = write(tmp_path, public_config(load_admin(
        write(tmp_path, EVERY_KEY, name="config.yaml"), env={})), name=".config.json")
    code = ("import sys\nfrom logcapture.config.admin import load_admin\n"
            f"a = load_admin({str(public)!r}, env={{}})\n"
            "print(a.redact_patterns[1], a.flush_records, 'yaml' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["/tok_[a-z0-9]{8}/", "200", "False"]


@pytest.mark.parametrize(("content", "message"), [
    (b'{"flush_records": 200,', r"\.config\.json:1:23: not the JSON of a public config"),
    (b'["flush_records"]', r"\.config\.json: must be a JSON object of key: value, not list"),
    (b'{"flush_records": "200"}', r"key 'flush_records': must be a whole number"),
    (b'{"flush_records": 0}', r"key 'flush_records': must be a whole number"),
    (b'{"flush_interval": true}', r"key 'flush_interval': must be a number"),
    (b'{"redact_patterns": "x"}', r"key 'redact_patterns': must be a list of text"),
    (b'{"cluster": ""}', r"key 'cluster': must be text"),
    (b'{"store": "chdb:///x"}', r"unknown key 'store' for a public config"),
    (b'{"retention_days": 3}', r"unknown key 'retention_days' for a public config"),
    (b'\xff{}', r"\.config\.json: is not valid UTF-8|not the JSON of a public config"),
])
def test_a_bad_public_config_is_refused_naming_the_file_and_key(tmp_path, content, message):
    path = write(tmp_path, content, name=".config.json")
    with pytest.raises(ConfigError, match=message) as e:
        load_admin(path, env={})
    assert e.value.path == str(path)


def test_every_check_of_the_admin_schema_has_a_kind_for_the_public_config():
    from logcapture.config.admin import _ADMIN_SCHEMA, _PUBLIC_KINDS

    assert {check.__qualname__ for check in _ADMIN_SCHEMA.values()} <= set(_PUBLIC_KINDS)


def test_a_public_config_nested_too_deeply_is_refused(tmp_path):
    path = write(tmp_path, b"[" * 100_000 + b"]" * 100_000, name=".config.json")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_admin(path, env={})
