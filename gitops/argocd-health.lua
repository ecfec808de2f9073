-- Argo CD health check for transcription.dev/TranscriptionDeployment and
-- transcription.dev/TranscriptionGateway (both report the same conditions).
-- Install: argocd-cm data keys `resource.customizations.health.transcription.dev_TranscriptionDeployment`
-- and `resource.customizations.health.transcription.dev_TranscriptionGateway`.
hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
if obj.status.observedGeneration == nil or obj.metadata.generation == nil
    or obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the latest spec"
  return hs
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Degraded" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = c.reason .. ": " .. (c.message or "")
    return hs
  end
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Progressing" and c.status == "True" then
    hs.status = "Progressing"
    hs.message = c.message or c.reason
    return hs
  end
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then
    if c.status == "True" then
      hs.status = "Healthy"
    else
      hs.status = "Progressing"
    end
    hs.message = c.message or c.reason
    return hs
  end
end
hs.status = "Progressing"
hs.message = "No Ready condition yet"
return hs
