SELECT claimed, epoch, owner FROM agentloop_claim($1, $2, $3)
