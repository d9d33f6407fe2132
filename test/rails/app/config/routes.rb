# frozen_string_literal: true

Rails.application.routes.draw do
  root "pages#show"
  get "/login/:user_id", to: "pages#login"
end
