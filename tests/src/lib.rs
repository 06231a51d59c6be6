//! End-to-end tests of agentloop: every service in-process against a real nats-server, a real
//! Postgres database and the fake model server over HTTP.

#[cfg(test)]
mod agent_loop;
#[cfg(test)]
mod bus_tls;
#[cfg(test)]
mod bus_trust;
#[cfg(test)]
mod dispatch_answers;
#[cfg(test)]
mod early_answer;
#[cfg(test)]
mod foundation;
#[cfg(test)]
mod gateway;
#[cfg(test)]
mod gateway_attacks;
#[cfg(test)]
mod gateway_exhaustion;
#[cfg(test)]
mod guard;
#[cfg(test)]
mod harness;
#[cfg(test)]
mod hybrid_recall;
#[cfg(test)]
mod inbox_cap;
#[cfg(test)]
mod injection;
#[cfg(test)]
mod knowledge;
#[cfg(test)]
mod leases;
#[cfg(test)]
mod mcp;
#[cfg(test)]
mod openclaw;
#[cfg(test)]
mod order;
#[cfg(test)]
mod poison;
#[cfg(test)]
mod principals;
#[cfg(test)]
mod recovery;
#[cfg(test)]
mod reply_order;
#[cfg(test)]
mod slack;
#[cfg(test)]
mod streams;
#[cfg(test)]
mod telegram;
#[cfg(test)]
mod tracing;
#[cfg(test)]
mod webhook;
