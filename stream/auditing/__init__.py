"""Human audits and coherence of a thesaurus: plans, ballots, simulated voters, rank correlations."""
