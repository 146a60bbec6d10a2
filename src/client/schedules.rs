//! The cron-schedule calls of the REST API client: `/api/v1/schedules` and
//! `/api/v1/cron/preview`.

use serde::Serialize;
use sked_types::{
    Backfill, BackfillPage, CreateSchedule, CronPreview, RunNow, Schedule, ScheduleDetail,
    SchedulePage, StartBackfill, UpdateSchedule,
};
use uuid::Uuid;

use super::{Client, ClientError};

/// Filters of `GET /api/v1/schedules`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScheduleQuery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Client {
    /// `POST /api/v1/schedules`: the created schedule.
    pub async fn create_schedule(&self, s: &CreateSchedule) -> Result<Schedule, ClientError> {
        self.post("/schedules", s).await
    }

    /// `GET /api/v1/schedules`.
    pub async fn schedules(&self, query: &ScheduleQuery) -> Result<SchedulePage, ClientError> {
        let url = self.url("/schedules");
        self.send(self.http.get(&url).query(query), url).await
    }

    /// `GET /api/v1/schedules`, as the raw JSON the server sent.
    pub async fn schedules_json(
        &self,
        query: &ScheduleQuery,
    ) -> Result<serde_json::Value, ClientError> {
        let url = self.url("/schedules");
        self.send(self.http.get(&url).query(query), url).await
    }

    /// `GET /api/v1/schedules/{id}`: the schedule, its next fire times and latest runs.
    pub async fn schedule(&self, id: Uuid) -> Result<ScheduleDetail, ClientError> {
        self.get(&format!("/schedules/{id}")).await
    }

    /// `GET /api/v1/schedules/{id}`, as the raw JSON the server sent.
    pub async fn schedule_json(&self, id: Uuid) -> Result<serde_json::Value, ClientError> {
        self.get(&format!("/schedules/{id}")).await
    }

    /// `PATCH /api/v1/schedules/{id}`: the schedule after the change.
    pub async fn update_schedule(
        &self,
        id: Uuid,
        change: &UpdateSchedule,
    ) -> Result<Schedule, ClientError> {
        let url = self.url(&format!("/schedules/{id}"));
        self.send(self.http.patch(&url).json(change), url).await
    }

    /// `POST /api/v1/schedules/{id}/pause`.
    pub async fn pause_schedule(&self, id: Uuid) -> Result<Schedule, ClientError> {
        self.post(&format!("/schedules/{id}/pause"), &serde_json::json!({}))
            .await
    }

    /// `POST /api/v1/schedules/{id}/resume`.
    pub async fn resume_schedule(&self, id: Uuid) -> Result<Schedule, ClientError> {
        self.post(&format!("/schedules/{id}/resume"), &serde_json::json!({}))
            .await
    }

    /// `POST /api/v1/schedules/{id}/run`: the task or workflow it submitted.
    pub async fn run_schedule(&self, id: Uuid) -> Result<RunNow, ClientError> {
        self.post(&format!("/schedules/{id}/run"), &serde_json::json!({}))
            .await
    }

    /// `POST /api/v1/schedules/{id}/backfills`: the backfill started.
    pub async fn start_backfill(
        &self,
        id: Uuid,
        backfill: &StartBackfill,
    ) -> Result<Backfill, ClientError> {
        self.post(&format!("/schedules/{id}/backfills"), backfill)
            .await
    }

    /// `GET /api/v1/schedules/{id}/backfills`: the schedule's backfills, newest first.
    pub async fn backfills(&self, id: Uuid) -> Result<BackfillPage, ClientError> {
        self.get(&format!("/schedules/{id}/backfills")).await
    }

    /// `GET /api/v1/backfills/{id}`.
    pub async fn backfill(&self, id: Uuid) -> Result<Backfill, ClientError> {
        self.get(&format!("/backfills/{id}")).await
    }

    /// `POST /api/v1/backfills/{id}/cancel`: the backfill after the cancel.
    pub async fn cancel_backfill(&self, id: Uuid) -> Result<Backfill, ClientError> {
        self.post(&format!("/backfills/{id}/cancel"), &serde_json::json!({}))
            .await
    }

    /// `DELETE /api/v1/schedules/{id}`: the schedule as it was.
    pub async fn delete_schedule(&self, id: Uuid) -> Result<Schedule, ClientError> {
        let url = self.url(&format!("/schedules/{id}"));
        self.send(self.http.delete(&url), url).await
    }

    /// `GET /api/v1/cron/preview?cron=&time_zone=&n=`.
    pub async fn cron_preview(
        &self,
        cron: &str,
        time_zone: Option<&str>,
        n: u32,
    ) -> Result<CronPreview, ClientError> {
        let url = self.url("/cron/preview");
        let mut query = vec![("cron", cron.to_owned()), ("n", n.to_string())];
        if let Some(tz) = time_zone {
            query.push(("time_zone", tz.to_owned()));
        }
        self.send(self.http.get(&url).query(&query), url).await
    }
}
