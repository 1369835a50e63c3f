/*
 * logcapture_task.so: a SPANK plugin that captures each task of an opted-in job's steps.
 *
 * Loaded from plugstack.conf on every node (spank(8), https://slurm.schedmd.com/spank.html):
 *
 *   optional /usr/lib/x86_64-linux-gnu/slurm/logcapture_task.so python=/opt/logcapture/bin/python3
 *
 * In slurm_spank_task_init (the task process, as the job's user, just before it execs the
 * step's program) it acts only when the job's environment holds LOGCAPTURE_TASKS, which the
 * job wrapper exports for a user who opted in, and never in the batch or extern step (the
 * wrapper captures the batch script itself). A task of an `srun --pty` step (the interactive
 * step of `salloc` too) is captured only when the user asks, whatever the job: see
 * interactive_task below. It starts `python -I -m logcapture slurm task` detached (a
 * grandchild, so the task never sees an unknown child), with the task's own
 * stdout and stderr as its stdout and stderr and one end of a socketpair as fd 3. The Python
 * side opens the task's pseudo-terminal(s) and hands the slave end(s) back over the socket
 * (SCM_RIGHTS, unix(7)); the plugin dup2s them onto the task's fds 1 and 2. The capture
 * process copies every byte to the task's original outputs, so the step's output is what it
 * would have been. The task stays slurmstepd's own child: its exit status, signals and
 * scancel are untouched.
 *
 * In slurm_spank_task_exit (slurmstepd, root, as the task's exit status is collected) it
 * tells the task's capture process the status over an abstract unix socket named after the
 * job, step and task, and waits (bounded) until that process has written the end of the
 * run and exited: once every task of the step has exited slurmstepd kills what is left in
 * the step, the capture process included, and waits a second for anything still there.
 *
 * In srun (local context, as the user) it keeps the tasks' lines from being stored a second
 * time with the batch script: srun writes what its tasks print to its own stdout and stderr,
 * the batch script's pty. In slurm_spank_init_post_opt, when the job's tasks are captured
 * (LOGCAPTURE_TASKS names a directory of the user's and the interpreter is there), it connects
 * to the batch capture (the abstract unix socket logcapture/batch/JOB, whose peer must be the
 * user: SO_PEERCRED), sends srun's fds 1 and 2 (SCM_RIGHTS) and gets back, for each that is
 * the batch's pty, the write end of a pipe that the batch capture copies to the batch's
 * outputs as it copies the pty, without storing it (logcapture/slurm/forward.py). It puts them
 * on fds 1 and 2; in slurm_spank_exit it puts the originals back and waits (bounded) until
 * the batch capture has copied all srun wrote, so that what the script prints next comes
 * after it. When there is no batch capture (an srun outside a captured batch script, or in a
 * task) nothing changes.
 *
 * Any failure leaves the task (or srun) as it was, uncaptured (or not forwarded), with one
 * line in slurmd's log (slurm_error/slurm_info) or on srun's stderr. The plugin never returns
 * an error to Slurm: with `optional` in plugstack.conf a missing plugin is skipped too.
 */
#define _GNU_SOURCE /* struct ucred, SO_PEERCRED (unix(7)) */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(logcapture_task, 1);

#define OPTIN_VAR "LOGCAPTURE_TASKS"
#define READY_TIMEOUT_MS 10000 /* Python's start on a loaded node, at most */
#define FINISH_TIMEOUT_MS 20000 /* the capture process's drain and end record, at most */
#define EXIT_TIMEOUT_MS (FINISH_TIMEOUT_MS + 2000) /* and its exit after that */
#define GONE_TIMEOUT_MS 1000 /* from its end of file to its exit, at most */
#define CAPTURE_FD 3
#define FORWARD_TIMEOUT_MS 5000 /* the batch capture's answer to srun, at most */

static char python[4096] = "";
static char spool_root[4096] = ""; /* plugstack.conf spool_root=, for interactive steps */
static int forward_sock = -1;            /* srun: the batch capture, while srun forwards */
static int forward_saved[3] = {-1, -1, -1}; /* srun: its fds 1 and 2 as they were */
static int forward_tried = 0;

/* The abstract socket name of one task's capture process (unix(7): a leading NUL byte). The
 * Python side (logcapture.slurm.task.status_address) makes the same name. */
static socklen_t task_address(struct sockaddr_un *addr, uint32_t job, uint32_t step,
                              uint32_t task)
{
    int n;

    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    n = snprintf(addr->sun_path + 1, sizeof(addr->sun_path) - 1,
                 "logcapture/task/%u.%u.%u", job, step, task);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* The abstract socket name of a job's batch capture; logcapture.slurm.forward.batch_address
 * makes the same. */
static socklen_t batch_address(struct sockaddr_un *addr, const char *job)
{
    int n;

    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    n = snprintf(addr->sun_path + 1, sizeof(addr->sun_path) - 1, "logcapture/batch/%s", job);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    int i;

    if (!spank_remote(sp) && spank_context() != S_CTX_LOCAL)
        return ESPANK_SUCCESS; /* sbatch, salloc: nothing to do */
    for (i = 0; i < ac; i++) {
        if (strncmp(av[i], "python=", 7) == 0)
            snprintf(python, sizeof(python), "%s", av[i] + 7);
        else if (strncmp(av[i], "spool_root=", 11) == 0)
            snprintf(spool_root, sizeof(spool_root), "%s", av[i] + 11);
        else if (spank_remote(sp))
            slurm_info("logcapture_task: unknown plugstack.conf argument %s ignored", av[i]);
    }
    return ESPANK_SUCCESS;
}

/* The step ids the wrapper captures itself, or that run no user program. (The interactive
 * step, salloc's shell with LaunchParameters=use_interactive_step, is an `srun --pty` step.) */
static int captured_step(uint32_t step)
{
    return step != SLURM_BATCH_SCRIPT && step != SLURM_EXTERN_CONT && step != SLURM_PENDING_STEP;
}

/* Start the capture process as a grandchild of the task, with `sock` as its fd 3. */
static int start_capture(spank_t sp, int sock, uint32_t job, uint32_t step, uint32_t task,
                         int local)
{
    char **env = NULL, **job_argv = NULL, **argv;
    char a_job[16], a_step[16], a_task[16], a_local[16], a_pid[16];
    pid_t child, pid = getpid();
    int status, job_argc = 0, i, n = 0;

    if (spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS || env == NULL)
        return -1;
    if (spank_get_item(sp, S_JOB_ARGV, &job_argc, &job_argv) != ESPANK_SUCCESS)
        job_argc = 0;
    argv = calloc((size_t)job_argc + 24, sizeof(char *));
    if (argv == NULL)
        return -1;
    snprintf(a_job, sizeof(a_job), "%u", job);
    snprintf(a_step, sizeof(a_step), "%u", step);
    snprintf(a_task, sizeof(a_task), "%u", task);
    snprintf(a_local, sizeof(a_local), "%d", local);
    snprintf(a_pid, sizeof(a_pid), "%d", (int)pid);
    /* -I: the job's PYTHON* variables cannot change which logcapture runs (python(1)). */
    argv[n++] = python, argv[n++] = "-I", argv[n++] = "-m", argv[n++] = "logcapture";
    argv[n++] = "slurm", argv[n++] = "task", argv[n++] = "--socket", argv[n++] = "3";
    /* In a heterogeneous job each component is a job of its own (S_JOB_ID) whose task ids
     * count from 0 (S_TASK_GLOBAL_ID): the two name this task's status socket, unique on the
     * node; the run is named after SLURM_PROCID (logcapture.slurm.task.global_rank). */
    argv[n++] = "--job", argv[n++] = a_job;
    argv[n++] = "--step", argv[n++] = a_step, argv[n++] = "--rank", argv[n++] = a_task;
    argv[n++] = "--local-rank", argv[n++] = a_local, argv[n++] = "--task-pid";
    argv[n++] = a_pid, argv[n++] = "--";
    for (i = 0; i < job_argc; i++)
        argv[n++] = job_argv[i]; /* the step's command, for the run's Start record */
    argv[n] = NULL;
    child = fork();
    if (child < 0) {
        free(argv);
        return -1;
    }
    if (child == 0) {
        /* A new session: no signal meant for the task's process group reaches it, and the
         * task never sees it as its child (its parent exits at once). */
        if (fork() != 0)
            _exit(0);
        setsid();
        if (sock == CAPTURE_FD) {
            if (fcntl(sock, F_SETFD, 0) < 0) /* dup2 onto itself keeps FD_CLOEXEC */
                _exit(127);
        } else if (dup2(sock, CAPTURE_FD) < 0) {
            _exit(127);
        }
        i = open("/dev/null", O_RDONLY | O_CLOEXEC); /* the task's stdin is the task's */
        if (i >= 0 && i != STDIN_FILENO)
            dup2(i, STDIN_FILENO);
        execve(python, argv, env);
        _exit(127);
    }
    free(argv);
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    return 0;
}

/* The slave fd(s) the capture process sends once it is ready; 0 when none came in time. */
static int receive_slaves(int sock, int fds[2])
{
    struct pollfd p = {.fd = sock, .events = POLLIN};
    char byte, buf[CMSG_SPACE(2 * sizeof(int))];
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = buf,
                         .msg_controllen = sizeof(buf)};
    struct cmsghdr *c;
    int n = 0, r;

    do {
        r = poll(&p, 1, READY_TIMEOUT_MS);
    } while (r < 0 && errno == EINTR);
    if (r <= 0)
        return 0;
    if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) <= 0)
        return 0;
    for (c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            if (n > 2)
                n = 2; /* never more than stdout's and stderr's */
            memcpy(fds, CMSG_DATA(c), n * sizeof(int));
        }
    }
    return n;
}

/* Whether the job's user has a .logoptin ($LOGCAPTURE_OPTIN, else $HOME/.logoptin of the
 * job's environment), as the job wrapper looks (logcapture.slurm.wrapper.optin_exists): only
 * then is Python started to read what it asks, so that everyone else's interactive steps
 * start as fast as without logcapture. */
static int optin_exists(spank_t sp)
{
    char path[4096], home[4096];
    struct stat st;

    if (spank_getenv(sp, "LOGCAPTURE_OPTIN", path, sizeof(path)) == ESPANK_SUCCESS
        && path[0] != '\0')
        return lstat(path, &st) == 0;
    if (spank_getenv(sp, "HOME", home, sizeof(home)) != ESPANK_SUCCESS || home[0] == '\0')
        return 0;
    if (snprintf(path, sizeof(path), "%s/.logoptin", home) >= (int)sizeof(path))
        return 0;
    return lstat(path, &st) == 0;
}

/* Make `slave` the task's controlling terminal and its fds 0, 1 and 2 in place of
 * slurmstepd's pty; 1 when done, 0 (the task still on slurmstepd's pty) when not. The task
 * leads its session (slurmstepd made it so for --pty): it must give up its terminal first
 * (TIOCNOTTY), which sends SIGHUP and SIGCONT to the terminal's foreground process group,
 * its own (ioctl_tty(2)): SIGHUP is ignored meanwhile. */
static int switch_terminal(int slave)
{
    struct sigaction ignore, hup;
    int r;

    memset(&ignore, 0, sizeof(ignore));
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    if (sigaction(SIGHUP, &ignore, &hup) < 0)
        return 0;
    r = ioctl(STDOUT_FILENO, TIOCNOTTY);
    if (r == 0 && ioctl(slave, TIOCSCTTY, 0) < 0) {
        (void)ioctl(STDOUT_FILENO, TIOCSCTTY, 0); /* slurmstepd's pty back */
        r = -1;
    }
    sigaction(SIGHUP, &hup, NULL);
    if (r < 0)
        return 0;
    /* Cannot fail with a valid fd; if it did, what the task writes on slurmstepd's pty
     * would still reach it, uncaptured. */
    (void)dup2(slave, STDIN_FILENO);
    (void)dup2(slave, STDOUT_FILENO);
    (void)dup2(slave, STDERR_FILENO);
    return 1;
}

static int wait_input(int fd, int ms);

/* A task of an `srun --pty` step (docs/architecture.md, "Interactive steps"): with a
 * .logoptin, start the capture process as for any task and send it the spool root
 * ("S<path>\n"). It answers "n" (`interactive: true` not asked for, or it cannot capture:
 * then it said why on the terminal) or "i" with the slave of a pty of its own, which
 * becomes the task's terminal (switch_terminal); the capture process then holds slurmstepd's
 * pty and relays it (logcapture/slurm/interactive.py). "Y" or "N" tells it which. */
static void interactive_task(spank_t sp)
{
    char hello[sizeof(spool_root) + 3], answer;
    uint32_t job = 0, step = 0, task = 0;
    int local = 0, sv[2], fds[2] = {-1, -1}, n, len, ok;

    if (!optin_exists(sp))
        return;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS
        || spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS
        || spank_get_item(sp, S_TASK_GLOBAL_ID, &task) != ESPANK_SUCCESS
        || spank_get_item(sp, S_TASK_ID, &local) != ESPANK_SUCCESS) {
        slurm_error("logcapture_task: job, step or task id unknown; task not captured");
        return;
    }
    if (!captured_step(step))
        return;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        slurm_error("logcapture_task: %u.%u task %u not captured: socketpair: %m",
                    job, step, task);
        return;
    }
    if (start_capture(sp, sv[1], job, step, task, local) < 0) {
        slurm_error("logcapture_task: %u.%u task %u not captured: cannot start %s: %m",
                    job, step, task, python);
        close(sv[0]);
        close(sv[1]);
        return;
    }
    close(sv[1]);
    len = snprintf(hello, sizeof(hello), "S%s\n", spool_root);
    if (send(sv[0], hello, (size_t)len, MSG_NOSIGNAL) == len
        && wait_input(sv[0], READY_TIMEOUT_MS) > 0
        && recv(sv[0], &answer, 1, MSG_PEEK) == 1 && answer == 'n') {
        close(sv[0]); /* not asked for, or it said on the terminal why it cannot */
        return;
    }
    n = receive_slaves(sv[0], fds);
    if (n == 0) {
        slurm_error("logcapture_task: %u.%u task %u not captured: the capture process "
                    "(%s -I -m logcapture slurm task) did not start", job, step, task, python);
        close(sv[0]);
        return;
    }
    ok = switch_terminal(fds[0]);
    close(fds[0]);
    if (n > 1)
        close(fds[1]);
    answer = ok ? 'Y' : 'N';
    (void)send(sv[0], &answer, 1, MSG_NOSIGNAL);
    close(sv[0]);
    if (!ok)
        slurm_error("logcapture_task: %u.%u task %u not captured: its terminal could not be "
                    "switched: %m", job, step, task);
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    char optin[8], port[16];
    spank_err_t found;
    uint32_t job = 0, step = 0, task = 0;
    int local = 0, sv[2], fds[2] = {-1, -1}, n;

    (void)ac;
    (void)av;
    if (!spank_remote(sp) || python[0] == '\0')
        return ESPANK_SUCCESS;
    /* srun --pty: the task has a terminal of its own, captured only when the user asks,
     * whether or not the job is a captured batch job (interactive_task). A terminal without
     * SLURM_PTY_PORT is slurmstepd's for unbuffered output (srun -u, or --pty that srun
     * disregarded because its stdout is no terminal, as in a batch script): its output goes
     * through srun as any step's, and the task is captured below. */
    if (isatty(STDOUT_FILENO)
        && spank_getenv(sp, "SLURM_PTY_PORT", port, sizeof(port)) == ESPANK_SUCCESS) {
        interactive_task(sp);
        return ESPANK_SUCCESS;
    }
    /* Its value (the job's spool directory) is the Python side's business: too long for the
     * buffer (ESPANK_NOSPACE) is there all the same. */
    found = spank_getenv(sp, OPTIN_VAR, optin, sizeof(optin));
    if (found != ESPANK_SUCCESS && found != ESPANK_NOSPACE)
        return ESPANK_SUCCESS; /* not opted in, or not a job the wrapper ran */
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS
        || spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS
        || spank_get_item(sp, S_TASK_GLOBAL_ID, &task) != ESPANK_SUCCESS
        || spank_get_item(sp, S_TASK_ID, &local) != ESPANK_SUCCESS) {
        slurm_error("logcapture_task: job, step or task id unknown; task not captured");
        return ESPANK_SUCCESS;
    }
    if (!captured_step(step))
        return ESPANK_SUCCESS;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        slurm_error("logcapture_task: %u.%u task %u not captured: socketpair: %m",
                    job, step, task);
        return ESPANK_SUCCESS;
    }
    if (start_capture(sp, sv[1], job, step, task, local) < 0) {
        slurm_error("logcapture_task: %u.%u task %u not captured: cannot start %s: %m",
                    job, step, task, python);
        close(sv[0]);
        close(sv[1]);
        return ESPANK_SUCCESS;
    }
    close(sv[1]);
    n = receive_slaves(sv[0], fds);
    if (n == 0) {
        slurm_error("logcapture_task: %u.%u task %u not captured: the capture process "
                    "(%s -I -m logcapture slurm task) did not start", job, step, task, python);
        close(sv[0]);
        return ESPANK_SUCCESS;
    }
    if (dup2(fds[0], STDOUT_FILENO) < 0 || dup2(n > 1 ? fds[1] : fds[0], STDERR_FILENO) < 0) {
        /* Cannot happen with valid fds; if it did, fd 1 may already be the pty, which the
         * capture process reads and copies: the output still reaches its place. */
        slurm_error("logcapture_task: %u.%u task %u: dup2: %m", job, step, task);
    }
    close(fds[0]);
    if (n > 1)
        close(fds[1]);
    close(sv[0]);
    return ESPANK_SUCCESS;
}

/* Poll `fd` for input for at most `ms` milliseconds; > 0 when it has some. */
static int wait_input(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;

    do {
        r = poll(&p, 1, ms);
    } while (r < 0 && errno == EINTR);
    return r;
}

/* Is `path` a directory of this user's (not a link): the job's spool the wrapper exported, as
 * logcapture.slurm.task.job_spool checks it. */
static int own_directory(const char *path)
{
    struct stat st;

    return path != NULL && path[0] == '/' && lstat(path, &st) == 0 && S_ISDIR(st.st_mode)
        && st.st_uid == getuid();
}

/* Put the received pipe(s) on srun's fds 1 and 2 as `map` says (module comment); 0 when done,
 * -1 (and fds 1 and 2 as they were) when not. */
static int forward_fds(const char *map, const int *fds, int n)
{
    int i, fd, k;

    for (i = 0; i < 2; i++) {
        fd = i + 1;
        if (map[i] == '-')
            continue;
        k = map[i] - '0';
        if (k < 0 || k >= n)
            goto undo;
        forward_saved[fd] = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (forward_saved[fd] < 0 || dup2(fds[k], fd) < 0)
            goto undo;
    }
    return 0;
undo:
    for (fd = 1; fd <= 2; fd++) {
        if (forward_saved[fd] >= 0) {
            dup2(forward_saved[fd], fd);
            close(forward_saved[fd]);
            forward_saved[fd] = -1;
        }
    }
    return -1;
}

/* srun: hand its fds 1 and 2 to the batch capture (the module comment). */
static void forward_start(void)
{
    const char *job = getenv("SLURM_JOB_ID");
    struct sockaddr_un addr;
    struct ucred peer;
    socklen_t len = sizeof(peer), alen;
    int sock, std[2] = {STDOUT_FILENO, STDERR_FILENO}, fds[2] = {-1, -1}, n = 0, i;
    char byte = 'F', reply[3], buf[CMSG_SPACE(2 * sizeof(int))];
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = buf,
                         .msg_controllen = sizeof(buf)};
    struct cmsghdr *c;
    ssize_t got;

    if (python[0] == '\0' || access(python, X_OK) != 0 || !own_directory(getenv(OPTIN_VAR))
        || job == NULL || job[0] == '\0' || strlen(job) > 20 || strspn(job, "0123456789")
        != strlen(job))
        return; /* the job's tasks are not captured: srun's output is the batch's to keep */
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return;
    alen = batch_address(&addr, job);
    if (connect(sock, (struct sockaddr *)&addr, alen) < 0) {
        close(sock); /* no batch capture here: srun in a task, or the job is not captured */
        return;
    }
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &len) < 0 || peer.uid != getuid()) {
        slurm_info("logcapture_task: the batch capture's socket is not yours; srun's output "
                   "is not forwarded");
        close(sock);
        return;
    }
    memset(buf, 0, sizeof(buf));
    c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    memcpy(CMSG_DATA(c), std, sizeof(std));
    if (sendmsg(sock, &msg, MSG_NOSIGNAL) != 1) {
        close(sock); /* fd 1 or 2 closed (srun >&-): leave them */
        return;
    }
    if (wait_input(sock, FORWARD_TIMEOUT_MS) <= 0) {
        slurm_info("logcapture_task: the batch capture did not answer in %d s; srun's output "
                   "is not forwarded", FORWARD_TIMEOUT_MS / 1000);
        close(sock);
        return;
    }
    iov.iov_base = reply;
    iov.iov_len = sizeof(reply);
    msg.msg_controllen = sizeof(buf);
    got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    for (c = CMSG_FIRSTHDR(&msg); got > 0 && c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            if (n > 2)
                n = 2;
            memcpy(fds, CMSG_DATA(c), n * sizeof(int));
        }
    }
    if (got == (ssize_t)sizeof(reply) && reply[0] == 'F' && forward_fds(reply + 1, fds, n) == 0)
        forward_sock = sock;
    else
        close(sock); /* N--: neither fd is the batch's pty */
    for (i = 0; i < n; i++)
        close(fds[i]);
}

/* srun, at its exit: the original fds back, and wait until the batch capture has copied
 * everything srun wrote. */
static void forward_end(void)
{
    char byte = 'E';
    int fd;

    if (forward_sock < 0)
        return;
    for (fd = 1; fd <= 2; fd++) {
        if (forward_saved[fd] >= 0) {
            dup2(forward_saved[fd], fd); /* closes srun's pipe end */
            close(forward_saved[fd]);
            forward_saved[fd] = -1;
        }
    }
    if (send(forward_sock, &byte, 1, MSG_NOSIGNAL) == 1
        && wait_input(forward_sock, FORWARD_TIMEOUT_MS) > 0)
        (void)recv(forward_sock, &byte, 1, 0);
    close(forward_sock);
    forward_sock = -1;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    (void)sp;
    (void)ac;
    (void)av;
    /* Once (srun calls it for each component of a heterogeneous step), in srun only. */
    if (spank_context() == S_CTX_LOCAL && !forward_tried) {
        forward_tried = 1;
        forward_start();
    }
    return ESPANK_SUCCESS;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
    (void)sp;
    (void)ac;
    (void)av;
    if (spank_context() == S_CTX_LOCAL)
        forward_end();
    return ESPANK_SUCCESS;
}

static long elapsed_ms(const struct timespec *since)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - since->tv_sec) * 1000L + (now.tv_nsec - since->tv_nsec) / 1000000L;
}

/* Poll `fd` for input until `limit_ms` after `since`; > 0 when it has some. */
static int wait_input_until(int fd, const struct timespec *since, long limit_ms)
{
    long left = limit_ms - elapsed_ms(since);

    return left > 0 ? wait_input(fd, (int)left) : 0;
}

/* A pidfd of process `pid` (pidfd_open(2), Linux 5.3): readable once the process has exited.
 * -1 where the kernel or the C library has none. */
static int open_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
    return pid > 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
#else
    (void)pid;
    return -1;
#endif
}

/* Wait (bounded) until the process behind `pidfd` has exited: its end of file comes while it
 * is still exiting, and slurmstepd's next look at the step (proctrack/cgroup reads the step
 * cgroup's cgroup.procs at once, then after 1 s, 2 s ...) still finds it there until it has.
 * Once exited it is a zombie, which cgroup.procs does not list (docs/architecture.md, "The
 * cost of a captured step"), so who reaps it, and when, does not matter. */
static void wait_exited(int pidfd, uint32_t job, uint32_t step, uint32_t task)
{
    if (pidfd < 0)
        return; /* no pidfd: as before, slurmstepd waits for it itself */
    if (wait_input(pidfd, GONE_TIMEOUT_MS) <= 0)
        slurm_info("logcapture_task: %u.%u task %u: the capture process had not exited %d ms "
                   "after closing its connection", job, step, task, GONE_TIMEOUT_MS);
}

int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
    uint32_t job = 0, step = 0, task = 0;
    int status = 0, sock, r, pidfd;
    ssize_t got = 0;
    uid_t uid = (uid_t)-1;
    struct sockaddr_un addr;
    struct ucred peer;
    socklen_t len = sizeof(peer), alen;
    struct timespec start;
    char msg[32], reply[8];

    (void)ac;
    (void)av;
    if (!spank_remote(sp) || python[0] == '\0')
        return ESPANK_SUCCESS;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS
        || spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS
        || spank_get_item(sp, S_TASK_GLOBAL_ID, &task) != ESPANK_SUCCESS
        || spank_get_item(sp, S_TASK_EXIT_STATUS, &status) != ESPANK_SUCCESS
        || spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS || !captured_step(step))
        return ESPANK_SUCCESS;
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return ESPANK_SUCCESS;
    alen = task_address(&addr, job, step, task);
    if (connect(sock, (struct sockaddr *)&addr, alen) < 0) {
        close(sock); /* the usual case: this task was not captured */
        return ESPANK_SUCCESS;
    }
    /* Only the job's own user may hold the name: anyone else's process would only delay
     * the step. */
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &len) < 0 || peer.uid != uid) {
        slurm_info("logcapture_task: %u.%u task %u: the capture socket is not the job "
                   "user's; ignored", job, step, task);
        close(sock);
        return ESPANK_SUCCESS;
    }
    /* `peer.pid` is the listener's; the pidfd is waited on only once that process has
     * answered, so it was alive, and the number its own, when this was taken. */
    pidfd = open_pidfd(peer.pid);
    snprintf(msg, sizeof(msg), "%d\n", status);
    if (send(sock, msg, strlen(msg), MSG_NOSIGNAL) < 0) {
        if (pidfd >= 0)
            close(pidfd);
        close(sock);
        return ESPANK_SUCCESS;
    }
    /* A reply, or end of file: the capture process is done. */
    clock_gettime(CLOCK_MONOTONIC, &start);
    r = wait_input_until(sock, &start, FINISH_TIMEOUT_MS);
    if (r <= 0)
        slurm_info("logcapture_task: %u.%u task %u: the capture process did not finish in "
                   "%d s", job, step, task, FINISH_TIMEOUT_MS / 1000);
    /* After the reply, end of file: the capture process keeps the connection open until it
     * exits. Once this returns and the step's last task is gone, slurmstepd looks for
     * processes left in the step (proctrack/cgroup: it SIGKILLs them and looks again after
     * 1 s, then 2, ...), so a capture process still exiting then would hold the step up by
     * a second; its end of file comes a moment before it has left the step's cgroup, hence
     * the pidfd wait after it. */
    while (r > 0 && (got = recv(sock, reply, sizeof(reply), 0)) > 0) {
        r = wait_input_until(sock, &start, EXIT_TIMEOUT_MS);
        if (r <= 0)
            slurm_info("logcapture_task: %u.%u task %u: the capture process did not exit in "
                       "time", job, step, task);
    }
    if (r > 0 && got == 0)
        wait_exited(pidfd, job, step, task);
    if (pidfd >= 0)
        close(pidfd);
    close(sock);
    return ESPANK_SUCCESS;
}
