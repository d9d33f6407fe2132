# frozen_string_literal: true

Rails.application.routes.draw do
  root "pages#show"
  get "/login/:user_id", to: "pages#login"
  get "/feed", to: "pages#feed" # <herald-subscription> under Turbo Drive (README's page example)
  get "/turbo", to: "pages#turbo" # Turbo Streams (Rails 7.2 app only: turbo-rails)
  mount Herald::Web => "/herald" # the dashboard, as the README mounts it (no auth in this fixture app)
end
