-- Argo CD's health of an FSDPTrainingJob (fsdp.dev/v1alpha1), from the status the operator writes.
-- As Argo CD's own check of a batch/v1 Job: Progressing while the job is on its way, Healthy once it
-- Succeeded, Degraded once it Failed (with its one-line message), Suspended while suspended or waiting
-- in Kueue's queue (a suspended Job is Suspended there too). docs/gitops.md says how to install it.
local hs = {}
if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to take the job"
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end
local phase = obj.status.phase
local said = phase
if obj.status.reason ~= nil and obj.status.reason ~= "" then
  said = said .. " (" .. obj.status.reason .. ")"
end
if obj.status.message ~= nil and obj.status.message ~= "" then
  said = said .. ": " .. obj.status.message
end
if phase == "Succeeded" then
  hs.status = "Healthy"
elseif phase == "Failed" then
  hs.status = "Degraded"
elseif phase == "Suspended" or phase == "Queued" then
  hs.status = "Suspended"
else
  hs.status = "Progressing"
end
hs.message = said
return hs
