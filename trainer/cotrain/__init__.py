"""Co-training: a policy and the other party of its episodes (a judge, a simulated user) learn together."""
