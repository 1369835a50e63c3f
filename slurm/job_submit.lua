--[[
logcapture: put every batch script under the job wrapper.

Slurm's job_submit/lua plugin (JobSubmitPlugins=lua) reads this file from the folder of
slurm.conf and re-reads it when its mtime changes. For each batch job we prepend one line,

    #!<LOGCAPTURE_JOB_LINE>

so the kernel runs the wrapper with the spooled script as its first argument. The script's
own "#!" line becomes line 2; the wrapper reads it and, for a user without ~/.logoptin,
execs that interpreter at once (no pty, no files). The opt-in decision is made at job
start on the node, never here: slurmctld usually cannot read home directories.

- srun/salloc allocations have no script (job_desc.script is nil): left alone.
- A script that already starts with the wrapper line is left alone (idempotent: requeue,
  a resubmitted script, or a site that chains job_submit plugins).
- Nothing here can refuse a job: any surprise leaves the script untouched.

Install: set LOGCAPTURE_JOB_LINE below (`slurm/dev-cluster` and docs/admin.md write it from
the installed location). The default runs the wrapper through `env -S` so that Python runs
isolated (-I): a job's PYTHONHOME/PYTHONPATH must not be able to break the wrapper.
--]]

-- @LOGCAPTURE_JOB_LINE@ (the installer rewrites the next line; keep it on one line)
local LOGCAPTURE_JOB_LINE = "/usr/bin/env -S /opt/logcapture/bin/python3 -I /opt/logcapture/bin/logcapture-job"

-- Linux reads at most 255 bytes of a "#!" line (BINPRM_BUF_SIZE is 256 since 5.1).
local MAX_SHEBANG = 255

local function wrapper_header()
   return "#!" .. LOGCAPTURE_JOB_LINE .. "\n"
end

-- Returns the new script, or nil when the script must be left as it is.
function logcapture_wrap(script)
   if type(script) ~= "string" or script == "" then
      return nil                     -- srun/salloc: no batch script
   end
   local header = wrapper_header()
   if #header - 1 > MAX_SHEBANG then
      return nil                     -- misconfigured: never break jobs
   end
   if script:sub(1, #header) == header then
      return nil                     -- already wrapped
   end
   if script:sub(1, 2) ~= "#!" then
      return nil                     -- sbatch refuses these; be safe anyway
   end
   return header .. script
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local ok, wrapped = pcall(logcapture_wrap, job_desc.script)
   if ok and wrapped ~= nil then
      job_desc.script = wrapped
   elseif not ok then
      slurm.log_error("logcapture job_submit: %s (script left unwrapped)", tostring(wrapped))
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
