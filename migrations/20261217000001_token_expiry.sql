-- API tokens may expire: a token past its `expires_at` is refused like a revoked one, so a
-- token handed out for a while stops working without anyone having to revoke it.
alter table sked.api_tokens
  add column expires_at timestamptz,
  add constraint api_tokens_expire_after_creation
    check (expires_at is null or expires_at > created_at);
