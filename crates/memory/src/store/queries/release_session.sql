SELECT agentloop_release($1, $2)
