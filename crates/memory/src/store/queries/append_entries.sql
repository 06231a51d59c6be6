SELECT held, appended FROM agentloop_append($1, $2, $3, $4, $5, $6, $7, $8, $9)
