SELECT held, run_found AS found, finished, released
FROM agentloop_finish_run($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                          $17, $18, $19, $20::jsonb)
